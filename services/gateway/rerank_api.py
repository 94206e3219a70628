"""Rerank routes' shapes (no I/O here): TEI's POST /rerank and the Cohere/Jina POST /v1/rerank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from embedfleet.services.gateway.errors import ApiError
from embedfleet.services.gateway.inputs import Limits, json_object, json_type, optional
from embedfleet.shared.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class RerankCall:
    model: str | None
    query: str
    texts: list[str]  # may be empty: the answer is an empty ranking
    top_n: int | None
    raw_scores: bool
    truncate: bool
    return_text: bool


def query_field(doc: dict, limits: Limits) -> str:
    query = doc.get("query")
    if not isinstance(query, str) or not query:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, f"'query' must be a non-empty string, got {json_type(query)}", "query"
        )
    if len(query) > limits.max_input_chars:
        raise ApiError(
            ErrorCode.INPUT_TOO_LONG,
            f"'query' has {len(query)} characters; the limit is {limits.max_input_chars}",
            "query",
        )
    return query


def texts_field(raw: Any, param: str, limits: Limits, objects: bool) -> list[str]:
    if not isinstance(raw, list):
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'{param}' must be a list, got {json_type(raw)}", param)
    if len(raw) > limits.max_inputs:
        raise ApiError(
            ErrorCode.TOO_MANY_INPUTS, f"'{param}' has {len(raw)} items; the limit is {limits.max_inputs}", param
        )
    texts = []
    for i, item in enumerate(raw):
        if objects and isinstance(item, dict):  # Cohere/Jina also take {"text": ...}
            item = item.get("text")
        if not isinstance(item, str):
            want = "a string or an object with 'text'" if objects else "a string"
            raise ApiError(ErrorCode.INVALID_REQUEST, f"'{param}[{i}]' must be {want}, got {json_type(item)}", param)
        if len(item) > limits.max_input_chars:
            raise ApiError(
                ErrorCode.INPUT_TOO_LONG,
                f"'{param}[{i}]' has {len(item)} characters; the limit is {limits.max_input_chars}",
                param,
            )
        texts.append(item)
    return texts


def top_n_field(doc: dict) -> int | None:
    top_n = optional(doc, "top_n", int)
    if top_n is not None and top_n <= 0:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'top_n' must be a positive integer", "top_n")
    return top_n


def parse_tei(body: bytes, limits: Limits) -> RerankCall:
    """``{"query", "texts", "raw_scores": false, "return_text": false, "truncate": false}``, and the
    extension ``model`` (none: the default model)."""
    doc = json_object(body)
    query = query_field(doc, limits)
    if "texts" not in doc:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'texts' is required", "texts")
    return RerankCall(
        model=optional(doc, "model", str),
        query=query,
        texts=texts_field(doc["texts"], "texts", limits, objects=False),
        top_n=top_n_field(doc),
        raw_scores=optional(doc, "raw_scores", bool, False),
        truncate=optional(doc, "truncate", bool, False),
        return_text=optional(doc, "return_text", bool, False),
    )


def parse_cohere(body: bytes, limits: Limits) -> RerankCall:
    """``{"model", "query", "documents": [str | {"text"}], "top_n", "return_documents"}`` (Cohere, Jina)."""
    doc = json_object(body)
    query = query_field(doc, limits)
    if "documents" not in doc:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'documents' is required", "documents")
    return RerankCall(
        model=optional(doc, "model", str),
        query=query,
        texts=texts_field(doc["documents"], "documents", limits, objects=True),
        top_n=top_n_field(doc),
        raw_scores=False,
        truncate=optional(doc, "truncate", bool, True),
        return_text=optional(doc, "return_documents", bool, False),
    )


def render_tei(call: RerankCall, indices: np.ndarray, scores: np.ndarray) -> bytes:
    rows = []
    for i, score in zip(indices.tolist(), scores.tolist()):
        row = {"index": i, "score": score}
        if call.return_text:
            row["text"] = call.texts[i]
        rows.append(row)
    return orjson.dumps(rows)


def render_cohere(call: RerankCall, model: str, request_id: str, indices: np.ndarray, scores: np.ndarray) -> bytes:
    results = []
    for i, score in zip(indices.tolist(), scores.tolist()):
        row: dict[str, Any] = {"index": i, "relevance_score": score}
        if call.return_text:
            row["document"] = {"text": call.texts[i]}
        results.append(row)
    return orjson.dumps({"id": request_id, "model": model, "results": results})
