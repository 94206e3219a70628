"""``POST /v1/search``: the query embedded as ``/v1/embeddings`` embeds one with ``input_type`` "query"
(the model's query prompt), the store's closest rows (services/gateway/search/store.py), and on request
their texts reranked as ``POST /v1/rerank`` ranks them (the scorer).

The model is the one whose vectors the store holds: ``--search-model`` when the gateway is given one (a
request may leave ``model`` out, or must name that one), else the request's ``model``, else the default
model; the store's dimension must be the model's. A table of multi-vectors (a page model's job, ColQwen2:
a vector per token of each page: LanceDB or Qdrant) is searched with the query's token vectors, by MaxSim; the
query is embedded as the table's rows are, so a dense model over such a table (or a multi-vector model
over a dense one) is refused before anything is embedded.
"""

from __future__ import annotations

import logging
import time
import uuid

import numpy as np
from starlette.responses import Response

from embedfleet.services.gateway.core import Embedder, offers
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Inputs
from embedfleet.services.gateway.openai.models import worker_kind
from embedfleet.services.gateway.rerank.api import RerankCall
from embedfleet.services.gateway.search import api as search_api
from embedfleet.services.gateway.search.store import SearchTables, query_output
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.model_dir.info import same_model
from embedfleet.shared.protocol import EmbedOptions
from embedfleet.shared.vectors.forms import FLOAT32

log = logging.getLogger("embedfleet.gateway")

ROUTE = "/v1/search"
NOT_SERVED = "search is not served here: start the gateway with --search-sink URL (a pgvector, LanceDB or Qdrant store)"


class Search:
    def __init__(self, store: SearchTables, model: str | None) -> None:
        self.store = store  # the store's tables, each read only by the keys that may use it
        self.model = model  # --search-model: the model whose vectors the store holds (None: the request says)

    def card(self) -> dict[str, object]:
        """What ``GET /v1/models`` says of search, to any key: the route, the kind of store and the table a
        request naming none reads, the model if pinned; nothing of the store's address, user or path."""
        return {"route": ROUTE, "store": self.store.kind, "table": self.store.own, "model": self.model}

    async def answer(self, fleet: Embedder, call: search_api.SearchCall) -> Response:
        store = await self.store.store(call.table)  # a table the key may not read: refused before any work
        model = await self._model(fleet, call.model)
        reranker = await self._reranker(fleet, call.rerank.model) if call.rerank is not None else None
        shape = await store.shape(fleet.request_timeout)  # what the rows are: the query is embedded to match
        output = query_output(model, await offers(fleet, model), shape, store.shown)
        options = EmbedOptions(input_type="query", dtype=FLOAT32.wire, output=output)
        outcome = await fleet.run_embed(model, Inputs([call.query], None), options)
        # the query: [dim], or its token vectors [q, dim] for a table of multi-vectors
        query = np.asarray(outcome.ragged_rows()[0], np.float32) if output == "multivector" else outcome.vectors[0]
        started = time.perf_counter()
        hits = await store.search(model, query, call.top_k, call.where, fleet.request_timeout)
        headers = {**fleet.stage_headers(outcome), "x-search-time": _ms(started)}
        log.debug(
            "search %s: %d hits of top_k %d in %s ms (filter on %s)",
            model,
            len(hits),
            call.top_k,
            headers["x-search-time"],
            ", ".join(sorted(call.where)) or "nothing",
        )
        if reranker is None or not hits:
            return _json(search_api.render_search(model, hits, outcome.tokens, reranker), headers)
        missing = next((h for h in hits if h.text is None), None)
        if missing is not None:
            raise ApiError(
                ErrorCode.INVALID_REQUEST,
                f"the search store holds no text for {missing.id!r}: rerank needs the "
                "rows' texts (loaded with them), or leave 'rerank' out",
                "rerank",
            )
        assert call.rerank is not None  # the reranker is its
        started = time.perf_counter()
        texts = [h.text or "" for h in hits]
        rerank = RerankCall(
            reranker, call.query, texts, call.rerank.top_n, raw_scores=False, truncate=True, return_text=False
        )
        _, ranked = await fleet.run_rerank(rerank, uuid.uuid4().hex)
        headers["x-rerank-time"] = _ms(started)
        log.debug("search %s: %d hits reranked by %s in %s ms", model, len(hits), reranker, headers["x-rerank-time"])
        return _json(
            search_api.render_search(model, hits, outcome.tokens, reranker, ranked.indices, ranked.scores), headers
        )

    async def _model(self, fleet: Embedder, requested: str | None) -> str:
        """The served model that embeds the query (see the module's docstring)."""
        if self.model is None:
            return await fleet.resolve_model(requested)
        if requested is not None and not same_model(requested, self.model):
            raise ApiError(
                ErrorCode.INVALID_REQUEST,
                f"the search store holds vectors of {self.model}: leave 'model' out or name that one",
                "model",
            )
        try:
            return await fleet.resolve_model(self.model)
        except ApiError as exc:
            if exc.code is not ErrorCode.MODEL_NOT_FOUND:
                raise
            raise ApiError(ErrorCode.NO_RESPONDERS, f"the search model {self.model} is not served right now") from None

    async def _reranker(self, fleet: Embedder, requested: str) -> str:
        """The served reranker ``requested`` names: a model of kind "rerank" (a cross-encoder; an embedder's
        cosine would only repeat the search's ranking)."""
        try:
            model = await fleet.resolve_model(requested)
        except ApiError as exc:
            raise ApiError(exc.code, exc.message, "rerank.model") from None
        workers = (await fleet.view()).workers
        kind = worker_kind(workers.get(model, {}))
        if kind != "rerank":
            served = sorted(m for m, w in workers.items() if worker_kind(w) == "rerank")
            raise ApiError(
                ErrorCode.INVALID_REQUEST,
                f"{model} is no reranker (its kind is {kind}): 'rerank.model' names "
                f"a cross-encoder ({', '.join(served) if served else 'none is served here'})",
                "rerank.model",
            )
        return model


def _ms(started: float) -> str:
    return str(round((time.perf_counter() - started) * 1000))


def _json(body: bytes, headers: dict[str, str]) -> Response:
    return Response(body, media_type="application/json", headers=headers)
