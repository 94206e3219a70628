"""The body of OpenAI's /v1/embeddings as a typed model: it validates a request and is the route's
request schema in /openapi.json (nothing restates a field by hand).

The model checks what a body alone decides (types, enums, ranges, required fields; unknown top-level
fields are ignored, as OpenAI's own API does, unknown 'chunking' keys refused); api.py then
checks what the gateway's settings decide (--max-inputs, --max-input-chars) and builds the request.
Types are strict: JSON's true is no integer and "8" no number.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, model_validator

from embedfleet.services.gateway.http.body_errors import member
from embedfleet.services.gateway.inputs import MAX_TOKEN_ID
from embedfleet.shared.protocol import MAX_DIMENSION

TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]


class InputItem(BaseModel):
    """One input of a list in Jina's form: a text, or an image for a two-tower model (CLIP)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    text: str | None = None
    image: str | None = Field(
        None, description="a data URI: data:image/png;base64,... (PNG, JPEG, WebP or a still GIF)", min_length=1
    )

    @model_validator(mode="after")
    def _one(self) -> InputItem:
        if (self.text is None) == (self.image is None):
            raise ValueError("an input item holds exactly one of 'text' and 'image'")
        return self


def _input_kind(value: Any) -> str | None:
    """Which form an ``input`` is in, told by its first item (as the tokenizer reads it)."""
    if isinstance(value, list) and value:
        first = value[0]
        if isinstance(first, int) and not isinstance(first, bool):
            return "<tokens>"
        if isinstance(first, list):
            return "<token_lists>"
    if isinstance(value, list):
        return "<texts>"
    return "<text>" if isinstance(value, str) else None


Input = Annotated[
    Annotated[str, member("text")]
    | Annotated[list[str], member("texts"), Field(min_length=1)]
    | Annotated[TokenIds, member("tokens")]
    | Annotated[list[TokenIds], member("token_lists"), Field(min_length=1)],
    Discriminator(
        _input_kind,
        custom_error_type="input_form",
        custom_error_message="Input should be a string, a list of strings, a list of token IDs or a list of "
        "token-ID lists",
    ),
    Field(description="a text, a list of texts, a list of token IDs, or a list of token-ID lists"),
]


def _embeddings_input_kind(value: Any) -> str | None:
    """``_input_kind``, and Jina's list of {'text': ...} / {'image': ...} items."""
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return "<items>"
    return _input_kind(value)


# /v1/embeddings' input: TEI's forms, and items that may be images
EmbeddingsInput = Annotated[
    Annotated[str, member("text")]
    | Annotated[list[str], member("texts"), Field(min_length=1)]
    | Annotated[TokenIds, member("tokens")]
    | Annotated[list[TokenIds], member("token_lists"), Field(min_length=1)]
    | Annotated[list[InputItem], member("items"), Field(min_length=1)],
    Discriminator(
        _embeddings_input_kind,
        custom_error_type="input_form",
        custom_error_message="Input should be a string, a list of strings, a list of token IDs, a list of "
        "token-ID lists or a list of {'text': ...} / {'image': ...} items",
    ),
    Field(
        description="a text, a list of texts, a list of token IDs, a list of token-ID lists, or a list of "
        "{'text': ...} / {'image': 'data:image/...;base64,...'} items (images: a two-tower model, CLIP, or a "
        "page model, ColQwen2, on /embed_all)"
    ),
]

# the vector forms a request may name (shared/vectors/forms.py's EMBEDDING_TYPES)
EmbeddingType = Literal["float", "float32", "float16", "int8", "uint8", "binary", "ubinary"]


# a bulk job's chunking (jobs/body.py); the embedding routes' ChunkingBody adds what they answer
def _text_kind(value: Any) -> str | None:
    if isinstance(value, list):
        return "<texts>"
    return "<text>" if isinstance(value, str) else None


# a text or a non-empty list of texts (TEI's inputs, Cohere's texts): one fault for a value of neither
# form, not one for each
TextOrTexts = Annotated[
    Annotated[str, member("text")] | Annotated[list[str], member("texts"), Field(min_length=1)],
    Discriminator(
        _text_kind,
        custom_error_type="input_form",
        custom_error_message="Input should be a string or a list of strings",
    ),
]


class ChunkSpecBody(BaseModel):
    """Each text cut into windows of at most 'size' tokens, a vector each."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid", populate_by_name=True)

    size: int = Field(
        ge=1,
        description="the most tokens of text a chunk holds; the model's special tokens and the prompt come "
        "on top and must fit its limit",
    )
    overlap: int = Field(0, ge=0, description="tokens consecutive chunks share at most (less than size)")
    boundary: Literal["token", "sentence"] = "token"
    late: bool = Field(
        False, description="late chunking: each chunk pooled from the token states of the text around it"
    )


class ChunkingBody(ChunkSpecBody):
    """An extension: each text cut into windows of at most 'size' tokens, each window embedded; a binary
    answer (Accept) takes return 'mean' only."""

    returns: Literal["chunks", "mean"] = Field(
        "chunks",
        alias="return",
        description="chunks: a vector per chunk with its offsets; mean: a vector per input, its chunks' mean "
        "weighted by tokens",
    )


# a task adapter of the model (OpenAI and Cohere routes: Jina's API names the field so)
Task = Annotated[str, Field(min_length=1, max_length=100)]
TASK = (
    "the model's task adapter the inputs run with, as Jina's API names them (jina-embeddings-v3: retrieval.query, "
    "retrieval.passage, separation, classification, text-matching; GET /v1/models lists a model's tasks), and "
    "the task's prompt where the model has one; on such a model an input_type of query / document chooses the "
    "retrieval adapters, and no task at all its base model. A task the model lacks: 400 naming those it has"
)


class EmbeddingsBody(BaseModel):
    """Create embeddings (OpenAI); a null optional field is as if absent."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    model: str = Field(min_length=1)
    input: EmbeddingsInput
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: Annotated[int, Field(ge=1, le=MAX_DIMENSION)] | None = None
    user: str | None = None
    input_type: Literal["query", "document"] | None = None
    task: Task | None = Field(None, description=TASK)
    embedding_type: EmbeddingType | None = Field(
        "float",
        description=(
            "an extension: the vector form made on the worker. float (= float32), float16; int8 / uint8: each "
            "component scaled by one fixed rule into -127..127 / 0..255; binary / ubinary: one sign bit a "
            "component (1 where > 0), packed 8 to a byte, first component in the highest bit, as int8 "
            "(bytes - 128) / uint8. With encoding_format float the rows are JSON numbers (integers for all but "
            "the float forms); with base64 their little-endian bytes."
        ),
    )
    chunking: ChunkingBody | None = None
    modality: Literal["text", "image"] | None = Field(
        None,
        description="infinity's: image reads each string of 'input' as an image, a data URI "
        "(data:image/png;base64,...), for a two-tower model (CLIP); text (the default) as a text",
    )
