"""Late-interaction reranking: a multi-vector model (a ColBERT-style MultiVectorEncoder, a page model such
as ColQwen2) makes token vectors and has no scorer, so the gateway ranks for it, by MaxSim.

The query is embedded as a query (input_type "query": a ColBERT model's query prompt; a page model's texts
are queries anyway) and the documents as documents (input_type "document": a ColBERT model's skiplist
applies), both with output "multivector" in float32, in concurrent fleet calls (a page model's image
documents in a call of their own). Then, for the query's token vectors Q [q, d] and a document's D [n, d],
each row normalised by the model, score = sum over Q's rows of the largest dot product with D's rows
(ColBERT's late interaction; transformers' ColQwen2Processor.score_retrieval). Scores are such sums, from 0
to q, not probabilities: ``raw_scores`` changes nothing. Each call's tokens are accounted as the embedding
routes account them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import numpy as np

from embedfleet.services.gateway.core import Fleet
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.openai.models import worker_inputs, worker_kind
from embedfleet.services.gateway.rerank.api import RerankCall
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.nats.embed_client import EmbedClient, EmbedOutcome, part_of
from embedfleet.shared.protocol import EmbedOptions, RerankResult


class LateFleet(Fleet, Protocol):
    """What a late-interaction rerank needs of the gateway: the fleet's client (so that an error names the
    query or a candidate, as the scorer's do), admission of its calls, and the accounting of their tokens."""

    @property
    def client(self) -> EmbedClient:
        """The fleet's client, whose embed calls the rerank makes."""
        ...

    @property
    def request_timeout(self) -> float:
        """Seconds the rerank's calls may take (--request-timeout)."""
        ...

    def admitted(self) -> AbstractAsyncContextManager[None]:
        """A block whose service errors are answered as the API's errors."""
        ...

    def account(self, model: str, outcome: EmbedOutcome) -> None:
        """``outcome``'s tokens in the metrics, by model and by API key, and charged to the request's key."""
        ...


def by_maxsim(worker: Mapping[str, str]) -> bool:
    """Whether the model a live worker registered reranks by MaxSim: it makes token vectors only (kind
    "multivector"), so it is no cross-encoder and has no dense vectors a scorer could rank by cosine."""
    return worker_kind(worker) == "multivector"


def texts_only(call: RerankCall, model: str) -> None:
    """``call`` unless it holds image documents, which ``model`` cannot rank: 400 naming the first."""
    if call.image_rows:
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"'documents[{call.image_rows[0]}]' is an image, and {model} ranks texts only: image documents "
            "need a page model (a multi-vector model that embeds images, such as ColQwen2)",
            "documents",
        )


def maxsim(query: np.ndarray, documents: Sequence[np.ndarray]) -> np.ndarray:
    """query [q, d], documents each [n_i, d] -> [len(documents)] float32: for each document, the sum over
    the query's rows of their largest dot product with the document's rows (0 for a document or a query
    without rows). All documents in one product: [q, sum n_i], then each document's columns reduced."""
    scores = np.zeros(len(documents), dtype=np.float32)
    sizes = np.array([len(d) for d in documents], dtype=np.int64)
    held = np.flatnonzero(sizes)
    if not len(query) or not len(held):
        return scores
    tokens = np.concatenate([documents[i] for i in held.tolist()]).astype(np.float32, copy=False)  # [N, d]
    sims = np.asarray(query, dtype=np.float32) @ tokens.T  # [q, N]
    starts = np.concatenate(([0], np.cumsum(sizes[held])[:-1]))  # each document's first column
    scores[held] = np.maximum.reduceat(sims, starts, axis=1).sum(axis=0, dtype=np.float32)
    return scores


def ranked(scores: np.ndarray, top_n: int | None) -> tuple[np.ndarray, np.ndarray]:
    """scores [n] -> (indices best first [k] int32, their scores [k] float32), the best ``top_n`` (None:
    all); equal scores keep the documents' order."""
    order = np.argsort(-scores, kind="stable")[:top_n]
    return order.astype(np.int32), scores[order].astype(np.float32)


async def rerank(
    fleet: LateFleet, model: str, worker: Mapping[str, str], call: RerankCall, request_id: str
) -> RerankResult:
    """``call``'s documents ranked against its query by MaxSim over ``model``'s token vectors (``worker``:
    what a live worker of it registered)."""
    if "image" not in worker_inputs(worker):
        texts_only(call, model)
    if not call.count:
        return RerankResult(request_id, indices=np.zeros(0, "<i4"), scores=np.zeros(0, "<f4"))
    timeout = fleet.request_timeout
    as_documents = _options("document", call.truncate)
    images = set(call.image_rows)
    text_rows = [i for i in range(call.count) if i not in images]
    calls: list[Awaitable[EmbedOutcome]] = [
        _of_query(fleet.client.embed(model, [call.query], _options("query", call.truncate), timeout))
    ]
    parts = []  # each document call's rows among the documents
    if call.texts:
        calls.append(part_of(fleet.client.embed(model, call.texts, as_documents, timeout), text_rows, "candidate"))
        parts.append(text_rows)
    if call.images:
        shown = fleet.client.embed(model, [], as_documents, timeout, images=call.images)
        calls.append(part_of(shown, call.image_rows, "candidate"))
        parts.append(list(call.image_rows))
    async with fleet.admitted():
        outcomes = await asyncio.gather(*calls)
    for outcome in outcomes:
        fleet.account(model, outcome)
    documents: list[np.ndarray] = [np.zeros((0, 0), np.float32)] * call.count
    for rows, outcome in zip(parts, outcomes[1:]):
        for at, vectors in zip(rows, outcome.ragged_rows()):
            documents[at] = vectors
    indices, scores = ranked(maxsim(outcomes[0].ragged_rows()[0], documents), call.top_n)
    return RerankResult(request_id, indices=indices, scores=scores)


def _options(input_type: str, truncate: bool) -> EmbedOptions:
    """Token vectors of the model's multi-vector head, float32, embedded as ``input_type``."""
    return EmbedOptions(output="multivector", input_type=input_type, truncate=truncate)


async def _of_query(call: Awaitable[EmbedOutcome]) -> EmbedOutcome:
    """The query's embed call: an error of its one input is said of the query."""
    try:
        return await call
    except ServiceError as exc:
        raise exc if exc.row is None else ServiceError(exc.code, exc.text("the query")) from None
