"""What POST /v1/search answers, as typed models (OpenAI's list style): /openapi.json's response schema
is made from them, and the tests hold what api.py's ``render_search`` writes to them (the route
writes with orjson)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from embedfleet.services.gateway.response_parts import ANSWER, omitted


class SearchHit(BaseModel):
    """One of the store's rows closest to the query."""

    model_config = ANSWER

    object: Literal["search_result"]
    id: str = Field(description="the row's id (its document's)")
    chunk: int = omitted("the chunk's number, when the store holds chunks")
    score: float = Field(
        description="the cosine of the query's vector and the row's; over a table of multi-vectors (a page "
        "model's), their MaxSim: the sum over the query's token vectors of the largest dot product with the row's"
    )
    rerank_score: float = omitted("with 'rerank': the reranker's score (the rows in its order)")
    text: str = omitted("the row's text, when the store holds it")
    metadata: dict[str, Any] = Field(description="the row's metadata fields (empty: none)")


class SearchUsage(BaseModel):
    """The query's tokens (the reranker's are not counted)."""

    model_config = ANSWER

    prompt_tokens: int
    total_tokens: int


class SearchAnswer(BaseModel):
    """POST /v1/search's answer: the hits in the store's order, or with 'rerank' in the reranker's."""

    model_config = ANSWER

    object: Literal["list"]
    model: str = Field(description="the model that embedded the query (whose vectors the store holds)")
    rerank_model: str = omitted("with 'rerank': the reranker")
    data: list[SearchHit] = Field(description="at most top_k (with rerank.top_n: at most top_n), best first")
    usage: SearchUsage
