"""The vector store ``POST /v1/search`` reads (``--search-sink URL``): a sink a table (the URL's own, or one
the request names), attached on the first search and again after a failure, called in a thread (the
stores' clients block). A request's key reads only the tables it may use (services/gateway/tenants.py).

One call at a time: a sink holds one connection, and psycopg's cannot carry two transactions at once.
A call that outlives the request's deadline answers 504 while it finishes in its thread; the next call
waits for it, so the sink is never used by two threads. The store's failures are answered with its own
message (the sink's ``shown`` URL, never a password): 503 when the store is down or not loaded (a
client may try again later, ``Retry-After`` says when), 400 when the store will never take the request (a
filter it cannot apply).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import numpy as np

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.tenants import TableAccess
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.sinks import Hit, Shape, Sink, SinkError, sink_for, with_table
from embedfleet.shared.vectors.forms import FORMS

log = logging.getLogger("embedfleet.gateway")

# the dense forms every store searches by cosine: float32, float16
SEARCHED_FORMS = tuple(name for name, form in FORMS.items() if form.floating)
RETRY_AFTER = 2  # seconds a client is told to wait before searching a store that is down or busy again
MAX_TABLES = 16  # tables attached at once; past it the least recently searched is closed
T = TypeVar("T")


def query_output(model: str, makes: tuple[str, ...], shape: Shape, shown: str) -> str:
    """The output the query is embedded as to search a table of ``shape`` rows: its own (dense, or
    multivector: the query's token vectors, for MaxSim), when ``model`` makes it (``makes``: the outputs
    its workers registered; none seen: the embed call answers for itself); 400 naming the model
    otherwise, since another model's vectors would rank the rows by nothing."""
    output = shape.output
    if not makes or output in makes:
        return output
    if output == "multivector":
        what = "multi-vectors"
        holds = "a vector per token of each row, searched by MaxSim: search with the multi-vector model that filled it"
    else:
        what = holds = f"{output} vectors"
        holds += ": search with the model that filled it"
    raise ApiError(
        ErrorCode.INVALID_REQUEST,
        f"{model} makes no {what} (it makes: {', '.join(makes)}); the search store {shown} holds {holds}",
        "model",
    )


class SearchTables:
    """The tables of the search store: the --search-sink URL's own (``own``), or another of the same
    store a request names, each a SearchStore of its own, the ``access`` of the request's key checked
    first. Qdrant's local mode opens a folder once at a time: one table attached at once there."""

    def __init__(self, url: str, access: TableAccess | None = None) -> None:
        first = SearchStore(sink_for(url))
        self._url = url
        self.own = first.sink.table_name
        self.shown = first.shown  # the URL without its password: the gateway's logs
        self.kind = urlsplit(url).scheme  # postgresql, lancedb, qdrant: what /v1/models says of the store
        self._access = access or TableAccess()
        self._stores: OrderedDict[str, SearchStore] = OrderedDict({self.own: first})
        self._most = 1 if getattr(first.sink, "local", False) else MAX_TABLES

    async def store(self, table: str | None) -> SearchStore:
        """The store of ``table`` (None: the URL's own), once the request's key may use it (403) and its
        name is one (400): checked before anything is connected to."""
        name = self.own if table is None else table
        self._access.check(name, "table")
        store = self._stores.get(name)
        if store is not None:
            self._stores.move_to_end(name)
            return store
        try:
            sink = sink_for(with_table(self._url, name))
        except SinkError as exc:
            raise ApiError(ErrorCode.INVALID_REQUEST, exc.message, "table") from None
        while len(self._stores) >= self._most:
            _, oldest = self._stores.popitem(last=False)
            await oldest.close()  # after its call in a thread, if one runs
        if (store := self._stores.get(name)) is None:  # another request may have attached it meanwhile
            store = self._stores[name] = SearchStore(sink, named=name != self.own)
        return store

    async def close(self, timeout: float = 5.0) -> None:
        for store in self._stores.values():
            await store.close(timeout)


class SearchStore:
    """One table of the search store. ``named``: a request named it (a table it lacks is the request's
    mistake, 404), else it is the --search-sink URL's own (not loaded yet: 503, try again later)."""

    def __init__(self, sink: Sink, named: bool = False) -> None:
        self.sink = sink
        self._named = named
        self.shown = sink.shown  # the URL without its password: logs, /v1/models, errors
        self._shape: Shape | None = None  # None: not attached (first use, or after a failure)
        self._lock = asyncio.Lock()

    async def shape(self, timeout: float) -> Shape:
        """What the table's rows are, attached first when they are not (within ``timeout`` seconds): the
        query is embedded to match them."""
        if self._shape is not None:
            return self._shape
        return await self._call(self._attached, timeout)

    async def search(
        self, model: str, query: np.ndarray, top_k: int, where: dict[str, Any], timeout: float
    ) -> list[Hit]:
        """The ``top_k`` rows closest to ``query`` (``model``'s: float32 [dim], or its token vectors [q, dim]
        for a table of multi-vectors) whose metadata has ``where``'s values, within ``timeout`` seconds."""
        return await self._call(functools.partial(self._search, model, query, top_k, where), timeout)

    async def _call(self, work: Callable[[], T], timeout: float) -> T:
        """``work`` in a thread, once the call before it ended, within ``timeout`` seconds (the wait for
        that call included)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            await asyncio.wait_for(self._lock.acquire(), timeout)
        except TimeoutError:
            raise self._late(timeout) from None
        running = asyncio.ensure_future(asyncio.to_thread(work))
        running.add_done_callback(self._release)
        try:  # shielded: a call past the deadline (or whose client left) holds the lock until its thread ends
            return await asyncio.wait_for(asyncio.shield(running), max(0.0, deadline - loop.time()))
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

    def _search(self, model: str, query: np.ndarray, top_k: int, where: dict[str, Any]) -> list[Hit]:
        shape = self._attached()
        if (query.ndim == 2) != (shape.output == "multivector"):  # the table was loaded again meanwhile
            raise ApiError(
                ErrorCode.NO_RESPONDERS,
                f"the search store {self.shown} now holds {shape.output} vectors: search again",
                retry_after=RETRY_AFTER,
            )
        if shape.dim != query.shape[-1]:
            raise ApiError(
                ErrorCode.INVALID_REQUEST,
                f"{model} makes vectors of {query.shape[-1]} dimensions; the search "
                f"store {self.shown} holds {shape.dim}: search with the model that filled it",
                "model",
            )
        try:
            return self.sink.search(query, top_k, where or None)
        except SinkError as exc:
            if not exc.retryable:  # the store will never take this request
                raise ApiError(ErrorCode.INVALID_REQUEST, exc.message, "filter" if where else None) from None
            log.warning("search store %s failed (attaching again on the next search): %s", self.shown, exc.message)
            self._detach()
            raise ApiError(
                ErrorCode.NO_RESPONDERS,
                f"the search store is unavailable, try again later: {exc.message}",
                retry_after=RETRY_AFTER,
            ) from None

    def _attached(self) -> Shape:
        if self._shape is not None:
            return self._shape
        try:
            shape = self.sink.attach()
        except SinkError as exc:
            self._detach()
            if self._named and not exc.retryable:
                raise ApiError(ErrorCode.NOT_FOUND, f"no table to search: {exc.message}", "table") from None
            raise ApiError(
                ErrorCode.NO_RESPONDERS,
                f"the search store is unavailable: {exc.message}",
                retry_after=RETRY_AFTER if exc.retryable else None,
            ) from None
        if shape.output == "multivector" and not getattr(self.sink, "searches_multivector", False):
            raise ApiError(
                ErrorCode.NO_RESPONDERS,
                f"the search store {self.shown} holds multi-vectors (a vector per token of each row); they are "
                "searched (by MaxSim) in LanceDB tables and Qdrant collections: load the job into one",
            )
        if shape.output != "multivector" and (shape.output != "dense" or shape.form not in SEARCHED_FORMS):
            raise ApiError(
                ErrorCode.NO_RESPONDERS,
                f"the search store {self.shown} holds {shape.output} {shape.form} "
                f"vectors; search is served over dense {' or '.join(SEARCHED_FORMS)} vectors",
            )
        log.info(
            "search store %s attached: %s %s vectors of %d dimensions%s",
            self.shown,
            shape.output,
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
