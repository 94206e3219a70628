"""Rerank routes' shapes (no I/O here): TEI's POST /rerank and the Cohere/Jina POST /v1/rerank.

/v1/rerank's body is a typed model (rerank_body.py), as is Cohere v2's /v2/rerank (cohere_api.py); both
then take the gateway's limits here (``within_limits``). TEI's /rerank is read field by field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from pydantic import ValidationError

from embedfleet.services.gateway.body_errors import fault_error
from embedfleet.services.gateway.errors import ApiError
from embedfleet.services.gateway.inputs import Limits, json_object, json_type, optional
from embedfleet.services.gateway.rerank_body import CohereRerankV1Body
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
    return query_within(query, limits)


def query_within(query: str, limits: Limits) -> str:
    """``query`` once it is within --max-input-chars (413 otherwise)."""
    if len(query) > limits.max_input_chars:
        raise ApiError(
            ErrorCode.INPUT_TOO_LONG,
            f"'query' has {len(query)} characters; the limit is {limits.max_input_chars}",
            "query",
        )
    return query


def texts_field(raw: Any, param: str, limits: Limits) -> list[str]:
    if not isinstance(raw, list):
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'{param}' must be a list, got {json_type(raw)}", param)
    for i, item in enumerate(raw):
        if not isinstance(item, str):
            raise ApiError(ErrorCode.INVALID_REQUEST, f"'{param}[{i}]' must be a string, got {json_type(item)}", param)
    return texts_within(raw, param, limits)


def texts_within(texts: list[str], param: str, limits: Limits) -> list[str]:
    """``texts`` once there are at most --max-inputs (422) and none is over --max-input-chars (413)."""
    if len(texts) > limits.max_inputs:
        raise ApiError(
            ErrorCode.TOO_MANY_INPUTS, f"'{param}' has {len(texts)} items; the limit is {limits.max_inputs}", param
        )
    for i, text in enumerate(texts):
        if len(text) > limits.max_input_chars:
            raise ApiError(
                ErrorCode.INPUT_TOO_LONG,
                f"'{param}[{i}]' has {len(text)} characters; the limit is {limits.max_input_chars}",
                param,
            )
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
        texts=texts_field(doc["texts"], "texts", limits),
        top_n=top_n_field(doc),
        raw_scores=optional(doc, "raw_scores", bool, False),
        truncate=optional(doc, "truncate", bool, False),
        return_text=optional(doc, "return_text", bool, False),
    )


# validate_json without model_validate_json's wrapper (bench/body_parsing.py)
_validate_v1 = CohereRerankV1Body.__pydantic_validator__.validate_json


def parse_cohere(body: bytes, limits: Limits) -> RerankCall:
    """/v1/rerank's body (CohereRerankV1Body: Cohere v1's and Jina's), within the gateway's ``limits``."""
    try:
        doc: CohereRerankV1Body = _validate_v1(body)
    except ValidationError as exc:
        raise fault_error(exc.errors(include_url=False)) from None
    texts = [d if isinstance(d, str) else d.text for d in doc.documents]
    return RerankCall(
        model=doc.model,
        query=query_within(doc.query, limits),
        texts=texts_within(texts, "documents", limits),
        top_n=doc.top_n,
        raw_scores=False,
        truncate=True if doc.truncate is None else doc.truncate,
        return_text=bool(doc.return_documents),
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
