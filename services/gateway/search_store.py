"""The vector store ``POST /v1/search`` reads (``--search-sink URL``): one sink, attached to its table on
the first search and again after a failure, called in a thread (the stores' clients block).

One call at a time: a sink holds one connection, and psycopg's cannot carry two transactions at once.
A call that outlives the request's deadline answers 504 while it finishes in its thread; the next call
waits for it, so the sink is never used by two threads. The store's failures are answered with its own
message (the sink's ``shown`` URL, never a password): 503 when the store is down or not loaded (a
client may try again later), 400 when the store will never take the request (a filter it cannot apply).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np

from embedfleet.services.gateway.errors import ApiError
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.sinks import Hit, Shape, Sink, SinkError
from embedfleet.shared.vector_forms import FORMS

log = logging.getLogger("embedfleet.gateway")

# the dense forms every store searches by cosine: float32, float16
SEARCHED_FORMS = tuple(name for name, form in FORMS.items() if form.floating)


class SearchStore:
    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.shown = sink.shown  # the URL without its password: logs, /v1/models, errors
        self._shape: Shape | None = None  # None: not attached (first use, or after a failure)
        self._lock = asyncio.Lock()

    async def search(
        self, model: str, vector: np.ndarray, top_k: int, where: dict[str, Any], timeout: float
    ) -> list[Hit]:
        """The ``top_k`` rows closest to ``vector`` (float32 [dim], ``model``'s) whose metadata has ``where``'s
        values, within ``timeout`` seconds (waiting for the call before it included)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            await asyncio.wait_for(self._lock.acquire(), timeout)
        except TimeoutError:
            raise self._late(timeout) from None
        work = asyncio.ensure_future(asyncio.to_thread(self._search, model, vector, top_k, where))
        work.add_done_callback(self._release)
        try:  # shielded: a call past the deadline (or whose client left) holds the lock until its thread ends
            return await asyncio.wait_for(asyncio.shield(work), max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise self._late(timeout) from None

    async def close(self, timeout: float = 5.0) -> None:
        """Let the call in its thread end (``timeout`` seconds at most: a store that hangs does not hold up
        the gateway's shutdown), then close the connection."""
        try:
            await asyncio.wait_for(self._lock.acquire(), timeout)
        except TimeoutError:
            log.warning("search store %s: a call still runs at shutdown; its connection is left to close", self.shown)
            return
        try:
            await asyncio.to_thread(self._detach)
        finally:
            self._lock.release()

    def _release(self, work: asyncio.Future) -> None:
        self._lock.release()
        if not work.cancelled():
            work.exception()  # retrieved: a call nobody waits for any more ends quietly

    def _late(self, timeout: float) -> ApiError:
        return ApiError(ErrorCode.TIMEOUT, f"the search store {self.shown} did not answer within {timeout:g}s")

    # -- in the thread ----------------------------------------------------------------------------

    def _search(self, model: str, vector: np.ndarray, top_k: int, where: dict[str, Any]) -> list[Hit]:
        shape = self._attached()
        if shape.dim != vector.shape[0]:
            raise ApiError(
                ErrorCode.INVALID_REQUEST,
                f"{model} makes vectors of {vector.shape[0]} dimensions; the search "
                f"store {self.shown} holds {shape.dim}: search with the model that filled it",
                "model",
            )
        try:
            return self.sink.search(vector, top_k, where or None)
        except SinkError as exc:
            if not exc.retryable:  # the store will never take this request
                raise ApiError(ErrorCode.INVALID_REQUEST, exc.message, "filter" if where else None) from None
            log.warning("search store %s failed (attaching again on the next search): %s", self.shown, exc.message)
            self._detach()
            raise ApiError(
                ErrorCode.NO_RESPONDERS, f"the search store is unavailable, try again later: {exc.message}"
            ) from None

    def _attached(self) -> Shape:
        if self._shape is not None:
            return self._shape
        try:
            shape = self.sink.attach()
        except SinkError as exc:
            self._detach()
            raise ApiError(ErrorCode.NO_RESPONDERS, f"the search store is unavailable: {exc.message}") from None
        if shape.output != "dense" or shape.form not in SEARCHED_FORMS:
            raise ApiError(
                ErrorCode.NO_RESPONDERS,
                f"the search store {self.shown} holds {shape.output} {shape.form} "
                f"vectors; search is served over dense {' or '.join(SEARCHED_FORMS)} vectors",
            )
        log.info(
            "search store %s attached: %s vectors of %d dimensions%s",
            self.shown,
            shape.form,
            shape.dim,
            ", chunks" if shape.chunked else "",
        )
        self._shape = shape
        return shape

    def _detach(self) -> None:
        self._shape = None
        try:
            self.sink.close()
        except Exception as exc:  # a broken connection closing: nothing left to release
            log.debug("closing the search store %s: %s", self.shown, exc)
