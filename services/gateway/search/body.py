"""The body of POST /v1/search as a typed model: it validates a request and is the route's request
schema in /openapi.json (nothing restates a field by hand).

The model checks what a body alone decides (types, ranges, the filter's names and values; unknown
top-level fields are ignored, unknown 'rerank' keys refused); api.py then checks what the
gateway's settings decide (--max-input-chars for the query, --max-inputs for top_k). Types are strict:
JSON's true is no integer and "8" no number. A null optional field is as if absent.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from embedfleet.services.gateway.inputs import MAX_NAME_CHARS

DEFAULT_TOP_K = 10
MAX_TOP_K = 1000  # an HNSW search past this many rows costs more than an exact one; rerank lists stay short
MAX_FILTER_FIELDS = 16
MAX_TABLE_CHARS = 255  # Qdrant's longest collection name; each store checks its own rule
MAX_FILTER_CHARS = 1024  # a filter's string value
FIELD_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$"  # a metadata field: no dots, no paths into it
INT64 = 1 << 63  # stores keep integers in 64 bits

Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
# what every store matches exactly; a bool is no integer here (strict)
FilterValue = Annotated[str, Field(max_length=MAX_FILTER_CHARS)] | Annotated[int, Field(ge=-INT64, lt=INT64)] | bool


class SearchRerankBody(BaseModel):
    """The hits' texts reranked by a cross-encoder, scored as POST /v1/rerank scores them."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    model: Name = Field(description="a reranker served here (a model of kind rerank)")
    top_n: Annotated[int, Field(ge=1)] | None = Field(None, description="the best this many (default: all hits)")


class SearchBody(BaseModel):
    """Search the gateway's vector store (--search-sink) with a query."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    model: Name | None = Field(
        None,
        description="the model whose vectors the store holds (default: the gateway's --search-model, else "
        "--default-model); it embeds the query with its query prompt",
    )
    query: str = Field(min_length=1, description="the text searched for (at most --max-input-chars)")
    table: Annotated[str, Field(min_length=1, max_length=MAX_TABLE_CHARS)] | None = Field(
        None,
        description="the table (Qdrant: collection) of the store to search, one the API key may use (the "
        "gateway's --key-tables-file); default: the --search-sink URL's",
    )
    top_k: Annotated[int, Field(ge=1, le=MAX_TOP_K)] | None = Field(
        DEFAULT_TOP_K, description="rows answered (at most --max-inputs too)"
    )
    filter: (
        Annotated[
            dict[Annotated[str, Field(pattern=FIELD_NAME)], FilterValue],
            Field(max_length=MAX_FILTER_FIELDS, json_schema_extra={"additionalProperties": False}),
        ]
        | None
    ) = Field(
        None,
        description="metadata fields (letters, digits, _ -) and the values they must equal (a string, an "
        "integer of 64 bits or a boolean)",
    )
    rerank: SearchRerankBody | None = None
