"""The bodies of Cohere's /v1/embed and /v2/embed as typed models: each validates a request and is its
route's request schema in /openapi.json (nothing restates a field by hand).

The models check what a body alone decides (types, enums, ranges); api.py then checks what the
gateway's settings decide (--max-inputs, --max-input-chars), that /v2/embed got its texts once ('texts'
or 'inputs'), and builds the request. Unknown fields are ignored, as Cohere's SDK sends fields of later
API versions; /v1/embed ignores v2's fields (output_dimension, max_tokens, chunking, ...) likewise.
Types are strict: JSON's true is no integer and "8" no number; a null optional field is as if absent.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from embedfleet.services.gateway.openai.body import TASK, ChunkingBody, Task, TextOrTexts
from embedfleet.shared.protocol import MAX_DIMENSION

Texts = Annotated[TextOrTexts, Field(description="the texts to embed, one an input (a string: one input)")]
# Cohere's names (cohere_api.INPUT_TYPES maps each to the model's prompt of that name; image: none)
InputType = Literal["search_query", "search_document", "classification", "clustering", "image"]
EmbeddingTypes = Annotated[
    list[Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]],
    Field(
        min_length=1,
        description=(
            "the forms answered, each an array under its name in 'embeddings' (a type asked twice: once): float; "
            "int8 / uint8 (one fixed rule, see docs/http-api.md, Vector forms); binary / ubinary (packed sign bits); "
            "base64 (each row's float32 bytes)"
        ),
    ),
]


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


Truncate = Annotated[
    Literal["NONE", "START", "END"],
    BeforeValidator(_upper),
    Field(
        description="END cuts an over-long input's end, START its start, NONE refuses it (any letter case)",
    ),
]


# an image as a client sends it: a data URI, or a URL the gateway fetches from its --image-hosts only
DataUri = Annotated[
    str,
    Field(
        pattern=r"^(data:|https?://)",
        description="data:image/png;base64,... (PNG, JPEG, WebP or a still GIF), or an https:// URL of a host "
        "the gateway's --image-hosts lists",
    ),
]


class CohereTextContent(BaseModel):
    """An input's content item: a text."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    type: Literal["text"]
    text: str


class CohereImageUrl(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    url: DataUri


class CohereImageContent(BaseModel):
    """An input's content item: an image, for a two-tower model (CLIP)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    type: Literal["image_url"]
    image_url: CohereImageUrl


class CohereEmbedInput(BaseModel):
    """One input of /v2/embed's ``inputs``: its content, one text or image item (a two-tower model embeds
    each alone: no fused text-and-image vector)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    content: Annotated[
        list[Annotated[CohereTextContent | CohereImageContent, Field(discriminator="type")]],
        Field(min_length=1, max_length=1),
    ]


class _EmbedFields(BaseModel):
    """The fields of both versions' bodies."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    model: str | None = Field(None, description="the served model that embeds (default: the gateway's --default-model)")
    input_type: InputType | None = Field(
        None,
        description="selects the model's prompt of the name: query, document, classification, clustering "
        "(a model without a prompt of that name: none)",
    )
    embedding_types: EmbeddingTypes | None = None
    task: Task | None = Field(None, description=TASK)
    truncate: Truncate | None = "END"


class CohereEmbedV1Body(_EmbedFields):
    """Embed (Cohere v1, ``Client.embed``)."""

    texts: Texts
    images: Annotated[list[Any], Field(max_length=0)] | None = Field(
        None, description="not served on v1: /v2/embed takes images (an empty list is as if absent)"
    )


class CohereEmbedV2Body(_EmbedFields):
    """Embed (Cohere v2, ``ClientV2.embed``): 'texts' or 'inputs', one of them; embedding_types defaults to
    ["float"]."""

    model_config = ConfigDict(
        strict=True,
        frozen=True,
        extra="ignore",
        json_schema_extra={"oneOf": [{"required": ["texts"]}, {"required": ["inputs"]}, {"required": ["images"]}]},
    )

    texts: Texts | None = None
    images: Annotated[list[DataUri], Field(min_length=1)] | None = Field(
        None, description="images to embed instead of texts, for a two-tower model (CLIP)"
    )
    inputs: Annotated[list[CohereEmbedInput], Field(min_length=1)] | None = Field(
        None, description="the inputs as content items: one text or image_url item an input"
    )
    output_dimension: Annotated[int, Field(ge=1, le=MAX_DIMENSION)] | None = Field(
        None, description="Matryoshka truncation to this many components, renormalised (at most the model's)"
    )
    max_tokens: Annotated[int, Field(ge=1)] | None = Field(
        None, description="a cap per input, accepted at or above the model's limit (inputs are cut there only)"
    )
    priority: int | None = Field(None, description="accepted: every request here has the same priority")
    chunking: ChunkingBody | None = None
