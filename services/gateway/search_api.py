"""``POST /v1/search``'s shapes (no I/O here): the request's fields, and the answer in OpenAI's list style.

    {"model"?, "query", "top_k"?: 10, "filter"?: {field: value}, "rerank"?: {"model", "top_n"?}}
 -> {"object": "list", "model", "rerank_model"?, "data": [{"object": "search_result", "id", "chunk"?, "score",
     "rerank_score"?, "text"?, "metadata"}], "usage": {"prompt_tokens", "total_tokens"}}

``score`` is the store's cosine of the query's vector and the row's; ``rerank_score`` the reranker's,
as ``POST /v1/rerank`` scores the same texts (the rows then in its order). ``usage`` counts the query's
tokens (the reranker's are not reported by the scorer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from embedfleet.services.gateway.errors import ApiError
from embedfleet.services.gateway.inputs import MAX_NAME_CHARS, Limits, json_object, json_type, name_field, optional
from embedfleet.services.gateway.rerank_api import query_field, top_n_field
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.sinks import Hit

DEFAULT_TOP_K = 10
MAX_TOP_K = 1000  # an HNSW search past this many rows costs more than an exact one; rerank lists stay short
MAX_FILTER_FIELDS = 16
MAX_FILTER_CHARS = 1024  # a filter's string value
FIELD_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$")  # a metadata field: no dots, no paths into it
INT64 = 1 << 63  # stores keep integers in 64 bits
_RERANK_KEYS = ("model", "top_n")


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


def parse_search(body: bytes, limits: Limits) -> SearchCall:
    doc = json_object(body)
    query = query_field(doc, limits)
    top_k = optional(doc, "top_k", int, DEFAULT_TOP_K)
    most = min(MAX_TOP_K, limits.max_inputs)
    if not 0 < top_k <= most:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'top_k' must be an integer in 1..{most}", "top_k")
    model = name_field(doc, "model")
    if model == "":
        raise ApiError(ErrorCode.INVALID_REQUEST, "'model' must name a served model (or be left out)", "model")
    return SearchCall(model, query, top_k, filter_field(doc.get("filter")), rerank_field(doc.get("rerank")))


def filter_field(raw: Any) -> dict[str, str | int | bool]:
    """``{field: value}``: rows whose metadata has each field equal to its value (a string, an integer
    or a boolean: what every store matches exactly)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"'filter' must be an object of metadata fields and the values they must equal, got {json_type(raw)}",
            "filter",
        )
    if len(raw) > MAX_FILTER_FIELDS:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, f"'filter' has {len(raw)} fields; the limit is {MAX_FILTER_FIELDS}", "filter"
        )
    for name, value in raw.items():
        if not FIELD_NAME.match(name):
            raise ApiError(
                ErrorCode.INVALID_REQUEST,
                f"'filter' field {name[:70]!r} is not a plain name (letters, digits, _ -, at most 64)",
                "filter",
            )
        if isinstance(value, str) and len(value) > MAX_FILTER_CHARS:
            raise ApiError(
                ErrorCode.INVALID_REQUEST,
                f"'filter.{name}' has {len(value)} characters; the limit is {MAX_FILTER_CHARS}",
                "filter",
            )
        if not isinstance(value, (str, bool, int)) or (isinstance(value, int) and not -INT64 <= value < INT64):
            raise ApiError(
                ErrorCode.INVALID_REQUEST,
                f"'filter.{name}' must be a string, an integer (64 bits) or a boolean, got {json_type(value)}",
                "filter",
            )
    return dict(raw)


def rerank_field(raw: Any) -> RerankAsk | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"'rerank' must be an object with 'model' and optionally 'top_n', got {json_type(raw)}",
            "rerank",
        )
    unknown = sorted(set(raw) - set(_RERANK_KEYS))
    if unknown:
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"'rerank' has unknown keys {', '.join(map(repr, unknown))}: it takes 'model' and 'top_n'",
            "rerank",
        )
    model = raw.get("model")
    if not isinstance(model, str) or not 0 < len(model) <= MAX_NAME_CHARS:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, "'rerank.model' is required: the name of a reranker served here", "rerank.model"
        )
    try:
        top_n = top_n_field(raw)
    except ApiError as exc:  # named as the field it is here
        raise ApiError(exc.code, exc.message.replace("'top_n'", "'rerank.top_n'"), "rerank.top_n") from None
    return RerankAsk(model, top_n)


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
