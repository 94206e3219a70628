"""The bodies of TEI's embedding routes (/embed, /embed_sparse, /embed_all, /tokenize) as typed models:
each validates a request and is the route's request schema in /openapi.json.

As text-embeddings-inference reads them (router/src/http/types.rs), with this gateway's extensions
(``model``, ``dimensions``, ``embedding_type``, ``chunking``, ``top_k``, ``threshold``, ``output``,
``input_type``). A model checks what the body alone decides; api.py then checks what the gateway's
settings and the model decide (--max-inputs, --max-input-chars, the outputs a model makes). Unknown
fields are ignored, as the hand-written parser did; a null optional field is as if absent (the API
module reads a None as the field's default). Types are strict: JSON's true is no integer.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

from embedfleet.services.gateway.inputs import MAX_NAME_CHARS
from embedfleet.services.gateway.openai.body import ChunkingBody, EmbeddingsInput, Input, TextOrTexts
from embedfleet.shared.protocol import MAX_DIMENSION
from embedfleet.shared.protocol.messages import MAX_SPARSE_TOP_K


def _direction(value: str) -> str:
    lowered = value.lower()
    if lowered not in ("right", "left"):
        raise PydanticCustomError("truncation_direction", "'Right' or 'Left'")
    return lowered


# TEI's "Right" / "Left", in any case; read as "right" / "left"
Direction = Annotated[
    str,
    AfterValidator(_direction),
    WithJsonSchema({"type": "string", "enum": ["Right", "Left", "right", "left"]}),
    Field(description="which end of an over-long input truncate cuts (any case)"),
]
Truncate = Annotated[
    bool | None, Field(description="cut an over-long input to the model's limit; false: refuse it (413)")
]
PromptName = Annotated[
    str | None,
    Field(max_length=MAX_NAME_CHARS, description="a prompt of the model's (sentence-transformers' prompts) to prefix"),
]
Model = Annotated[
    str | None,
    Field(
        description="an extension: which served model answers (default: the gateway's --default-model); 404 for "
        "an unknown one"
    ),
]
EmbeddingType = Annotated[
    Literal["float", "float32", "float16", "int8", "uint8", "binary", "ubinary"] | None,
    Field(
        description='an extension: the vector form made on the worker (docs/http-api.md, "Vector forms"); float = float32; '
        "the integer forms' rows are JSON integers"
    ),
]


TextInput = Annotated[TextOrTexts, Field(description="a text or a list of texts")]


class TeiBody(BaseModel):
    """What every TEI body shares: strict types, unknown fields ignored, no infinities."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore", allow_inf_nan=False)


class _Cut(TeiBody):
    """What the embedding routes share: how an over-long input is cut, the prompt."""

    truncate: Truncate = False
    truncation_direction: Direction | None = "right"
    prompt_name: PromptName = None


class _EmbedInputs(_Cut):
    """The embedding routes' inputs (texts or token IDs) and how an over-long one is cut."""

    inputs: Input


class EmbedBody(_EmbedInputs):
    """Embed (TEI): a vector per input."""

    normalize: bool | None = Field(True, description="L2-normalise each vector")
    dimensions: Annotated[int, Field(ge=1, le=MAX_DIMENSION)] | None = Field(
        None, description="a Matryoshka model's vectors cut to their first components (then normalised)"
    )
    embedding_type: EmbeddingType = "float"
    chunking: ChunkingBody | None = None
    model: Model = None


class EmbedSparseBody(_EmbedInputs):
    """Sparse vectors (TEI): SPLADE's, or BGE-M3's lexical weights."""

    top_k: Annotated[int, Field(ge=1, le=MAX_SPARSE_TOP_K)] | None = Field(
        None, description="an extension: keep each vector's k largest values"
    )
    threshold: float | None = Field(None, description="an extension: drop values at or below this")
    model: Model = None


class EmbedAllBody(_Cut):
    """A vector per token (TEI): hidden states, or a multi-vector head's (ColBERT-style, BGE-M3, ColQwen2)."""

    inputs: EmbeddingsInput  # TEI's forms, and Jina's items: a page model's (ColQwen2) images

    output: Literal["tokens", "multivector"] | None = Field(
        None,
        description="an extension: last hidden states, or the model's multi-vector head (its default when it has one)",
    )
    input_type: Literal["query", "document"] | None = None
    embedding_type: EmbeddingType = "float"
    model: Model = None


class TokenizeBody(TeiBody):
    """Tokenize (TEI): each text's tokens with their offsets."""

    inputs: TextInput
    add_special_tokens: bool | None = Field(True, description="the model's special tokens ([CLS], [SEP]) too")
    prompt_name: PromptName = None
    model: Model = None
