"""Rerank routes' shapes (no I/O here): TEI's POST /rerank and the Cohere/Jina POST /v1/rerank.

Every rerank body is a typed model: /v1/rerank's (body.py), Cohere v2's /v2/rerank (cohere/api.py)
and TEI's /rerank (tei/task_bodies.py, read in tei/tasks.py); each then takes the gateway's limits here
(``query_within``, ``texts_within``). /v1/rerank's image documents (Jina's ``{"image": data URI}``) are
decoded and checked here, before the call reaches any model; a page model ranks them (late.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from embedfleet.services.gateway.http.body_errors import read_body
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Limits
from embedfleet.services.gateway.rerank.body import CohereRerankV1Body, ImageDocument
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
    # image documents (/v1/rerank): their files, and each one's index among the documents; ``texts`` then
    # holds the other documents, in order. None: every document is a text
    images: list[bytes] | None = None
    image_rows: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        """The documents ranked, texts and images."""
        return len(self.texts) + len(self.image_rows)

    def documents(self) -> list[str | None]:
        """Each document's text in the request's order; None for an image document."""
        if not self.image_rows:
            return list(self.texts)
        texts, images = iter(self.texts), set(self.image_rows)
        return [None if i in images else next(texts) for i in range(self.count)]


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
    """/v1/rerank's body (CohereRerankV1Body: Cohere v1's and Jina's), within the gateway's ``limits``;
    its image documents decoded, each header checked (a refused one is a 400 naming it)."""
    # images.py reaches this module through core.py (RerankCall): imported when called, so no circle
    from embedfleet.services.gateway.images import image_files

    doc = read_body(CohereRerankV1Body, body)
    query = query_within(doc.query, limits)
    # an image's place holds "" while the limits are checked: it counts, and the texts keep their indices
    said = [d if isinstance(d, str) else "" if isinstance(d, ImageDocument) else d.text for d in doc.documents]
    texts_within(said, "documents", limits)
    shown = {i: d.image for i, d in enumerate(doc.documents) if isinstance(d, ImageDocument)}
    images = image_files(list(shown.values()), [f"documents[{i}]" for i in shown], limits.images) if shown else None
    return RerankCall(
        model=doc.model,
        query=query,
        texts=[text for i, text in enumerate(said) if i not in shown] if shown else said,
        top_n=doc.top_n,
        raw_scores=False,
        truncate=True if doc.truncate is None else doc.truncate,
        return_text=bool(doc.return_documents),
        images=images,
        image_rows=tuple(shown),
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
    """Cohere v1's and Jina's answer; with return_documents each text document's text (an image document
    is the client's own: not sent back)."""
    documents = call.documents() if call.return_text else []
    results = []
    for i, score in zip(indices.tolist(), scores.tolist()):
        row: dict[str, Any] = {"index": i, "relevance_score": score}
        if call.return_text and (text := documents[i]) is not None:
            row["document"] = {"text": text}
        results.append(row)
    return orjson.dumps({"id": request_id, "model": model, "results": results})
