"""The bodies of the Cohere-style rerank routes as typed models: POST /v1/rerank (Cohere v1's and Jina's
shape, OpenAI's errors) and POST /v2/rerank (Cohere v2's, Cohere's errors). Each validates a request and
is its route's request schema in /openapi.json.

The models check what a body alone decides; api.py and cohere/api.py then check the gateway's
limits (--max-inputs on the documents, --max-input-chars on the query and each document). Unknown fields
are ignored; types are strict; a null optional field is as if absent. An empty 'documents' is an empty
ranking. /v1/rerank also takes Jina's image documents, ``{"image": data URI}``, which a page model
(ColQwen2) ranks by MaxSim (rerank/late.py); every other model refuses them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, model_validator

from embedfleet.services.gateway.http.body_errors import member

Query = Annotated[str, Field(min_length=1, description="the text the documents are ranked against")]
TopN = Annotated[int, Field(ge=1, description="answer the best top_n documents only (none: all of them)")]
_MODEL = (
    "the reranker that scores: a cross-encoder, or a multi-vector model (ColBERT-style, ColQwen2) that ranks by "
    "MaxSim (default: the gateway's --default-model)"
)


class CohereDocument(BaseModel):
    """A document as an object (Cohere v1, Jina): its text; other keys are ignored."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    text: str


class ImageDocument(BaseModel):
    """A document as an image (Jina's multimodal rerank shape), for a page model (ColQwen2); other keys
    are ignored, but 'text' beside 'image' is refused: a document is one or the other."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    image: str = Field(
        min_length=1, description="a data URI: data:image/png;base64,... (PNG, JPEG, WebP or a still GIF)"
    )

    @model_validator(mode="before")
    @classmethod
    def _one(cls, value: Any) -> Any:
        if isinstance(value, dict) and "text" in value:
            raise ValueError("an object with 'text' or 'image', not both")
        return value


def _document_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "<text>"
    if isinstance(value, dict):
        return "<image>" if "image" in value else "<object>"
    return None


Document = Annotated[
    Annotated[str, member("text")]
    | Annotated[CohereDocument, member("object")]
    | Annotated[ImageDocument, member("image")],
    Discriminator(
        _document_kind,
        custom_error_type="document_form",
        custom_error_message="Input should be a string or an object with 'text'",
    ),
]


class CohereRerankV1Body(BaseModel):
    """Rerank documents by relevance to a query (Cohere v1, Jina)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    model: str | None = Field(None, description=_MODEL)
    query: Query
    documents: list[Document] = Field(
        description="the documents ranked: strings or objects with 'text'; for a page model (ColQwen2) also "
        "objects with 'image' (a data URI)"
    )
    top_n: TopN | None = None
    return_documents: bool | None = Field(
        False, description="each result carries its document's text (an image document's: none, it is the client's)"
    )
    truncate: bool | None = Field(True, description="documents over the model's limit are cut there (false: refused)")


class CohereRerankV2Body(BaseModel):
    """Rerank documents by relevance to a query (Cohere v2, ``ClientV2.rerank``); documents over the model's
    limit are cut, as Cohere cuts them."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    model: str | None = Field(None, description=_MODEL)
    query: Query
    documents: list[str] = Field(description="the texts ranked")
    top_n: TopN | None = None
    max_tokens_per_doc: Annotated[int, Field(ge=1)] | None = Field(
        None, description="a cap per document, accepted at or above the model's limit (documents are cut there only)"
    )
    priority: int | None = Field(None, description="accepted: every request here has the same priority")
    relevant_spans: Any = Field(None, description="not supported: refused unless empty")
