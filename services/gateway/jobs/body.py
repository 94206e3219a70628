"""The body of POST /v1/jobs as a typed model: it validates a submission and is the route's request
schema in /openapi.json (nothing restates a field by hand).

The model checks what a body alone decides (types, enums, ranges; unknown top-level fields are
ignored, unknown 'chunking' keys refused, a document's fields besides 'id' and 'text' (or 'image') kept
as its row's metadata); api.py then checks what the fields decide together (documents or path, an
output and its form), what the gateway's settings decide (--jobs-dir, --job-sinks) and what the
fleet serves. Types are strict: JSON's true is no integer and "8" no number. A null optional field
is as if absent, except 'id', 'documents', 'path' and 'sink', whose null is refused as before: they
say what to do, and a null says nothing.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field

from embedfleet.services.gateway.http.body_errors import member
from embedfleet.services.gateway.openai.body import ChunkSpecBody, EmbeddingType
from embedfleet.shared.jobs.ids import RULE

DEFAULT_BATCH = 64
MAX_BATCH = 4096  # documents a batch: one JetStream message each


def _id_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "<text>"
    return "<number>" if isinstance(value, int) and not isinstance(value, bool) else None


DocumentId = Annotated[
    Annotated[str, member("text")] | Annotated[int, member("number")],
    Discriminator(
        _id_kind, custom_error_type="document_id", custom_error_message="Input should be a string or an integer"
    ),
    Field(description="unique within the job; an integer is taken as its decimal string"),
]


def _omittable(**kwargs: Any) -> Any:
    """A field a body may leave out (then None) but not give as null: a null meets its type's error, and
    the schema says so (its type without null, the default null). Any, so that a type checker takes
    the type annotated (what a given value is)."""
    return Field(None, **kwargs)


class DocumentBody(BaseModel):
    """A document of an inline job: a text, or an image (for a two-tower model), one of the two; its
    other fields are its row's metadata when the job has a 'sink'."""

    model_config = ConfigDict(strict=True, frozen=True, extra="allow")

    id: DocumentId
    text: str = _omittable(description="the document's text (or give 'image')")
    image: str = _omittable(
        description="the document's image as a data URI (data:image/png;base64,...), for a two-tower model such "
        "as CLIP (or give 'text'); a job's documents are all texts or all images"
    )


class JobBody(BaseModel):
    """Submit a bulk job: 'documents' inline or a 'path' in the gateway's --jobs-dir, one of the two."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    model: str | None = Field(None, description="which served model embeds (default: the gateway's --default-model)")
    id: str = _omittable(
        description=f"the job's id (default: one made up; for a path job, the file's as reindex makes it): {RULE}",
    )
    documents: list[DocumentBody] = _omittable(min_length=1, description="the documents, inline")
    path: str = _omittable(min_length=1, description="a file under the gateway's --jobs-dir (as reindex reads)")
    input_type: Literal["query", "document"] | None = None
    embedding_type: EmbeddingType | None = Field(
        "float", description="the vector form stored (float = float32; sparse values: float or float16)"
    )
    output: Literal["dense", "sparse", "multivector"] | None = Field(
        "dense", description="what the model makes a document; a model that does not make it is refused"
    )
    batch_size: Annotated[int, Field(ge=1, le=MAX_BATCH)] | None = Field(
        DEFAULT_BATCH, description="documents a batch (cut smaller when a batch would not fit a NATS message)"
    )
    chunking: ChunkSpecBody | None = Field(
        None, description="each document cut into chunks of at most 'size' tokens, a vector each (dense only)"
    )
    with_text: bool | None = Field(
        False,
        description="store each chunk's text beside its vector (with sink: each document's when the job has no chunks)",
    )
    sink: str = _omittable(
        min_length=1,
        description=(
            "a vector store to write the rows into, one of the gateway's --job-sinks without its password, the "
            "table chosen: postgresql://USER@HOST:PORT/DB?table=NAME, lancedb:///PATH?table=NAME, "
            "qdrant://HOST:PORT?collection=NAME"
        ),
    )
