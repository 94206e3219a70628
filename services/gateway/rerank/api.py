"""Rerank routes' shapes (no I/O here): TEI's POST /rerank and the Cohere/Jina POST /v1/rerank.

Every rerank body is a typed model: /v1/rerank's (body.py), Cohere v2's /v2/rerank (cohere/api.py)
and TEI's /rerank (tei/task_bodies.py, read in tei/tasks.py); each then takes the gateway's limits here
(``query_within``, ``texts_within``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from embedfleet.services.gateway.http.body_errors import read_body
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Limits
from embedfleet.services.gateway.rerank.body import CohereRerankV1Body
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


def query_within(query: str, limits: Limits) -> str:
    """``query`` once it is within --max-input-chars (413 otherwise)."""
    if len(query) > limits.max_input_chars:
        raise ApiError(
            ErrorCode.INPUT_TOO_LONG,
            f"'query' has {len(query)} characters; the limit is {limits.max_input_chars}",
            "query",
        )
    return query


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


def parse_cohere(body: bytes, limits: Limits) -> RerankCall:
    """/v1/rerank's body (CohereRerankV1Body: Cohere v1's and Jina's), within the gateway's ``limits``."""
    doc = read_body(CohereRerankV1Body, body)
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
