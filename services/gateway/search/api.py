"""``POST /v1/search``'s shapes (no I/O here): the request (a SearchBody, body.py, within the
gateway's limits), and the answer in OpenAI's list style.

    {"model"?, "query", "table"?, "top_k"?: 10, "filter"?: {field: value}, "rerank"?: {"model", "top_n"?}}
 -> {"object": "list", "model", "rerank_model"?, "data": [{"object": "search_result", "id", "chunk"?, "score",
     "rerank_score"?, "text"?, "metadata"}], "usage": {"prompt_tokens", "total_tokens"}}

``score`` is the store's cosine of the query's vector and the row's (over a table of multi-vectors, the
MaxSim of their token vectors, as POST /v1/rerank scores a multi-vector model); ``rerank_score`` the reranker's,
as ``POST /v1/rerank`` scores the same texts (the rows then in its order). ``usage`` counts the query's
tokens (the reranker's are not reported by the scorer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from pydantic_core import ErrorDetails

from embedfleet.services.gateway.http.body_errors import fault_error, read_body
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Limits, json_type
from embedfleet.services.gateway.rerank.api import query_within
from embedfleet.services.gateway.search.body import DEFAULT_TOP_K, MAX_FILTER_CHARS, MAX_TOP_K, SearchBody
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.sinks import Hit


@dataclass(frozen=True, slots=True)
class RerankAsk:
    model: str
    top_n: int | None  # None: every candidate, reranked


@dataclass(frozen=True, slots=True)
class SearchCall:
    model: str | None  # None: the gateway's --search-model, else its default model
    query: str
    top_k: int
    where: dict[str, str | int | bool]  # metadata fields that must equal these values; empty: none
    rerank: RerankAsk | None
    table: str | None = None  # the store's table to read (None: the --search-sink URL's)


def parse_search(body: bytes, limits: Limits) -> SearchCall:
    """The request ``body`` holds (SearchBody), within the gateway's ``limits``; ApiError otherwise."""
    doc = read_body(SearchBody, body, _fault)
    query = query_within(doc.query, limits)
    top_k = doc.top_k or DEFAULT_TOP_K
    if top_k > limits.max_inputs:  # MAX_TOP_K the model's bound
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"'top_k' must be at most {min(MAX_TOP_K, limits.max_inputs)} (the gateway's --max-inputs), got {top_k}",
            "top_k",
        )
    rerank = None if doc.rerank is None else RerankAsk(doc.rerank.model, doc.rerank.top_n)
    return SearchCall(doc.model, query, top_k, dict(doc.filter or {}), rerank, doc.table)


def _fault(errors: list[ErrorDetails]) -> ApiError:
    """A fault within 'filter' (whose names are the client's, not fields of the body) in the words the
    route has always used for it; every other fault as body_errors words it."""
    loc = errors[0]["loc"]
    if loc[0] != "filter" or len(loc) < 2:
        return fault_error(errors)
    name = str(loc[1])
    if loc[-1] == "[key]":
        message = f"'filter' field {name[:70]!r} is not a plain name (letters, digits, _ -, at most 64)"
    elif any(e["type"] == "string_too_long" for e in errors if e["loc"][:2] == loc[:2]):
        message = f"'filter.{name}' has {len(errors[0]['input'])} characters; the limit is {MAX_FILTER_CHARS}"
    else:
        message = (
            f"'filter.{name}' must be a string, an integer (64 bits) or a boolean, got {json_type(errors[0]['input'])}"
        )
    return ApiError(ErrorCode.INVALID_REQUEST, message, "filter")


def render_search(
    model: str,
    hits: list[Hit],
    tokens: int,
    rerank_model: str | None = None,
    indices: np.ndarray | None = None,
    scores: np.ndarray | None = None,
) -> bytes:
    """The answer: ``hits`` in the store's order, or (``indices``, ``scores``: the reranker's ranking
    of them, best first) in the reranker's."""
    if indices is None or scores is None:
        data = [_row(hit) for hit in hits]
    else:
        data = [_row(hits[i], score) for i, score in zip(indices.tolist(), scores.tolist())]
    body: dict[str, Any] = {"object": "list", "model": model}
    if rerank_model is not None:
        body["rerank_model"] = rerank_model
    body |= {"data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return orjson.dumps(body)


def _row(hit: Hit, rerank_score: float | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"object": "search_result", "id": hit.id}
    if hit.chunk is not None:
        row["chunk"] = hit.chunk
    row["score"] = hit.score
    if rerank_score is not None:
        row["rerank_score"] = rerank_score
    if hit.text is not None:
        row["text"] = hit.text
    row["metadata"] = hit.metadata
    return row
