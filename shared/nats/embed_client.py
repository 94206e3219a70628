"""Embedding requests over NATS: publish to the tokenizer fleet, gather the workers' result chunks.

One wildcard inbox subscription serves every request of the process; each attempt's reply subject
is ``<inbox>.<attempt id>``. A request split into k chunks comes back as several EmbedResult
messages, each naming its rows; the request completes when every row arrived, fails on the first
error, and times out at its deadline.

Embedding is idempotent, so work that may be lost is sent again, as a new attempt holding the rows
still missing, up to ``retries`` times per request and always under the request's own deadline:

- when a process of the fleet dies (``resend_missing``, called by a FleetWatch, within a fraction of
  a second of a SIGKILL), the missing rows of that model's requests in flight go out again at once
  while the fleet still serves the model: those the dead process may have held, known from the Held
  replies workers send while the fleet has several workers of the model (with one, or a worker
  unknown to the watch when the request went out, every missing row goes again; duplicates are
  kept once);
- when an attempt's rows are known lost because nobody took them (no tokenizer answered: a 503
  status; or a tokenizer found no worker: a ``no_responders`` error reply), and when a process died
  and nothing serves the model any more, the rows wait until a fresh look at the fleet shows it
  served again (a process restarted), then go out. Nothing back before the deadline: 503, not 504.

Rows that arrive twice are kept once. While the NATS connection is down nothing is sent: new requests
and those in flight fail at once (503).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import numpy as np
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError

from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.nats.bundles import Item
from embedfleet.shared.nats.outbox import Outbox
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.observability.tracing import HEADER_BYTES, TraceContext, current, headers_for
from embedfleet.shared.protocol import (
    Cancel,
    ChunkLayout,
    ChunkRequest,
    DecodeRequest,
    DecodeResult,
    EmbedOptions,
    EmbedRequest,
    EmbedResult,
    ErrorReply,
    Held,
    ProtocolError,
    Replies,
    RerankRequest,
    RerankResult,
    Spans,
    TokenizeRequest,
    TokenizeResult,
    decode,
    encode,
)
from embedfleet.shared.text_chunks import ChunkSpec
from embedfleet.shared.vectors.forms import WIRE_FORMS

log = logging.getLogger("embedfleet.client")

T = TypeVar("T")

_NO_RESPONDERS = "503"
# seconds before its deadline at which a request whose rows wait for the model to be served again is
# answered 503 (before the wait_for at the deadline answers 504)
_GIVE_UP_BEFORE = 0.2
_NOBODY = "no tokenizer or worker is serving this model right now"


class Fleet(Protocol):
    """What the client asks of the fleet's watch (embedfleet.shared.nats.fleet.FleetWatch)."""

    def serves(self, model: str) -> bool:
        """Whether the latest view has a tokenizer and a worker for ``model``."""

    async def wait_serving(self, model: str, since: float, until: float) -> bool:
        """Whether a view taken after ``since`` serves ``model`` before ``until`` (monotonic times)."""

    def workers(self, model: str) -> int:
        """How many live workers of ``model`` it knows."""

    def silenced(self, model: str) -> tuple[str, ...]:
        """Workers of ``model`` it took for stopped lately (silent, their connections open)."""


@dataclass(slots=True)
class EmbedOutcome:
    vectors: np.ndarray  # [n, width(dim)] of the form's element type
    tokens: int  # real tokens processed, special tokens included
    timings: dict[str, float]  # seconds per stage (tokenize, queue, inference): the slowest chunk's
    dim: int = 0  # components per row (a bit-packed row holds ceil(dim / 8) bytes)
    form: str = "float32"  # the vector form (shared/vectors/forms.py) the rows came in: the request's options.form
    # sparse / tokens / multivector: per input, its (indices, values) or its [n, width] vectors (vectors is empty)
    ragged: list | None = None

    def ragged_rows(self) -> list:
        """``ragged``, of a request whose output is per input (sparse, tokens, multivector)."""
        assert self.ragged is not None, "per-input rows asked for, and the answer holds none"
        return self.ragged


class _Pending:
    """Rows gathered so far for one request, over all its attempts."""

    def __init__(self, request: EmbedRequest, future: asyncio.Future) -> None:
        self.request = request
        self.id = request.id
        self.total = request.count
        self.future = future
        self.vectors: np.ndarray | None = None
        self.dim = 0
        self.dtype = ""  # the wire code of the first result's form
        self.ragged: list | None = None  # per input, for sparse / tokens / multivector results
        self.filled = np.zeros(self.total, dtype=bool)
        self.rows = 0
        self.tokens = 0
        self.timings: dict[str, float] = {}
        self.attempts: list[str] = []  # attempt ids, the first is the request id
        self.resending = False  # a resend is under way
        self.resend_task: asyncio.Task | None = None  # that resend: it ends with the request
        self.parked = False  # its missing rows wait for the model to be served again
        self.held: dict[str, np.ndarray] = {}  # worker id -> rows it holds (bool mask over the request's rows)
        self.lost = np.zeros(self.total, dtype=bool)  # rows to send again (those still missing then)
        self.trace: TraceContext | None = current()  # sent with every attempt (a resend runs in another task)

    def fail(self, error: ServiceError) -> None:
        if not self.future.done():
            self.future.set_exception(error)

    def expire(self) -> None:
        """Its deadline passed: the request is answered with a timeout."""
        if not self.future.done():
            self.future.set_exception(TimeoutError())

    def add(self, result: EmbedResult, index: np.ndarray | None) -> None:
        """Rows of one attempt; ``index`` maps that attempt's rows to the request's (None: the same)."""
        if self.future.done():
            return
        ragged = result.offsets is not None
        if not ragged and index is None and not self.rows and result.start == 0 and result.total == self.total:
            whole = result.array()
            if len(whole) == self.total:  # the whole request in one result (a lone query's): taken as it came
                self.vectors, self.dim, self.dtype = whole.copy(), result.dim, result.dtype
                self.filled[:] = True
                self.rows, self.tokens, self.timings = self.total, result.tokens, dict(result.timings)
                self.future.set_result(
                    EmbedOutcome(self.vectors, self.tokens, self.timings, self.dim, WIRE_FORMS[self.dtype].name)
                )
                return
        # [count, width] rows, or per input its vectors / (indices, values) (sparse, tokens, multivector)
        rows = result.ragged() if ragged else result.array()
        end = result.start + len(rows)
        count = self.total if index is None else len(index)
        if result.total != count or end > count:
            raise ProtocolError(f"result rows {result.start}..{end} do not fit a request of {count}")
        if self.vectors is None:
            self.vectors = np.empty(
                (0, 0) if ragged else (self.total, np.shape(rows)[1]), dtype=WIRE_FORMS[result.dtype].dtype
            )
            self.dim, self.dtype = result.dim, result.dtype
            self.ragged = [None] * self.total if ragged else None
        elif (self.dim, self.dtype, self.ragged is not None) != (result.dim, result.dtype, ragged):
            raise ProtocolError("result chunks disagree on dimension, dtype or kind")
        where = np.arange(result.start, end) if index is None else index[result.start : end]
        fresh = ~self.filled[where]
        if not fresh.any():
            return  # a duplicate: an earlier attempt delivered these rows
        if self.ragged is not None:  # as ``ragged``: checked to agree above
            for row, item, new in zip(where.tolist(), rows, fresh.tolist()):
                if new:
                    self.ragged[row] = item
        else:
            self.vectors[where[fresh]] = rows[fresh]
        self.filled[where[fresh]] = True
        self.rows += int(fresh.sum())
        # a chunk that overlaps rows from another attempt counts its tokens pro rata
        self.tokens += result.tokens if fresh.all() else round(result.tokens * fresh.mean())
        for stage, seconds in result.timings.items():
            self.timings[stage] = max(self.timings.get(stage, 0.0), seconds)
        if self.rows == self.total:
            self.future.set_result(
                EmbedOutcome(
                    self.vectors, self.tokens, self.timings, self.dim, WIRE_FORMS[self.dtype].name, self.ragged
                )
            )

    def missing(self) -> np.ndarray:
        return np.flatnonzero(~self.filled)

    def hold(self, held: Held, index: np.ndarray | None) -> None:
        """A worker took rows of one attempt; ``index`` maps them to the request's (None: the same)."""
        count = self.total if index is None else len(index)
        if held.start + held.rows > count:
            raise ProtocolError(f"held rows {held.start}..{held.start + held.rows} do not fit a request of {count}")
        rows = (
            np.arange(held.start, held.start + held.rows)
            if index is None
            else index[held.start : held.start + held.rows]
        )
        self.held.setdefault(held.holder, np.zeros(self.total, dtype=bool))[rows] = True

    def lose(self, role: str, instance: str) -> bool:
        """``role`` ``instance`` died: the rows it held are lost, and so may be those no worker holds yet
        (in a tokenizer, or on their way to a worker). Whether any of them is still missing."""
        gone = self.held.pop(instance, None) if role == "worker" else None
        unheld = ~np.logical_or.reduce(list(self.held.values())) if self.held else np.ones(self.total, dtype=bool)
        self.lost |= unheld if gone is None else (gone | unheld)
        return bool((self.lost & ~self.filled).any())


def reply_error(reply: ErrorReply, rows: int, index: np.ndarray | None = None, noun: str = "input") -> ServiceError:
    """A service's error reply as a ServiceError of the request; ``rows``: the inputs of the request the
    reply answers, ``index``: their rows in the whole request (None: the same)."""
    if reply.row is None:
        return ServiceError(reply.code, reply.message)
    if reply.row >= rows:
        raise ProtocolError(f"error row {reply.row} is outside a request of {rows}")
    return ServiceError(reply.code, reply.message, reply.row if index is None else int(index[reply.row]), noun)


async def part_of(call: Awaitable[T], rows: Sequence[int], noun: str = "input") -> T:
    """Await a call for some of a request's inputs, ``rows`` (its rows in the request): an input's error
    is said of its row in the request, and of the inputs as the request's API names them (``noun``)."""
    try:
        return await call
    except ServiceError as exc:
        if exc.row is None:
            raise
        raise exc.at(rows[exc.row], noun) from None


def _subset(request: EmbedRequest, attempt: str, rows: np.ndarray) -> EmbedRequest:
    """The rows ``rows`` of ``request``, as a request of their own under the id ``attempt``."""
    pick = rows.tolist()
    return replace(
        request,
        id=attempt,
        texts=[request.texts[i] for i in pick] if request.texts else [],
        token_ids=None if request.token_ids is None else [request.token_ids[i] for i in pick],
        pairs=None if request.pairs is None else [request.pairs[i] for i in pick],
        images=None if request.images is None else [request.images[i] for i in pick],
        spans=None if request.spans is None else request.spans.take(rows),
    )


class EmbedClient:
    """Sends EmbedRequests and gathers their results; shared by the gateway and the scorer.

    ``retries``: attempts after the first for work that may be lost; ``fleet``: who serves what (a
    FleetWatch), asked before rows are sent again; without it rows nobody took fail the request at once.
    """

    def __init__(self, nc: Client, subjects: Subjects, retries: int = 2, fleet: Fleet | None = None) -> None:
        self._nc = nc
        self._subjects = subjects
        self._retries = retries
        self._fleet = fleet
        self._inbox = ""
        self._pending: dict[str, _Pending] = {}
        self._attempts: dict[str, tuple[_Pending, np.ndarray | None]] = {}  # attempt id -> request, row map
        # the attempt a Requests message went with -> every attempt in it (a no-responders answer names the first)
        self._bundled: dict[str, list[str]] = {}
        self._outbox = Outbox(nc, self._carried, self._unsent)
        self._sub: Subscription | None = None
        self._watching = False  # whether a dropped connection fails what is in flight (_watch_connection)
        self._hooked = False  # whether the connection's disconnected callback calls ours
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_reply)
        self._watch_connection()

    async def stop(self) -> None:
        self._watching = False
        for task in list(self._tasks):  # resends waiting for a worker: nothing will take their rows now
            task.cancel()
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def embed(
        self,
        model: str,
        texts: list[str],
        options: EmbedOptions,
        timeout: float,
        token_ids: list[np.ndarray] | None = None,
        pairs: list[tuple[str, str]] | None = None,
        spans: Spans | None = None,
        images: list[bytes] | None = None,
    ) -> EmbedOutcome:
        """Embed ``texts`` (or inputs given as ``token_ids``, or (query, document) ``pairs`` for a
        cross-encoder, whose "vectors" are its logits, or ``images``, files, for a two-tower model) with ``model``; with output "spans", ``spans``
        says which ranges of each text's content tokens make a vector each (late chunking).

        Raises ServiceError (timeout, no responders, ...).
        """
        self._check_connected()
        request_id = os.urandom(16).hex()
        request = EmbedRequest(
            id=request_id,
            model=model,
            texts=texts if token_ids is None and pairs is None and images is None else [],
            deadline=time.time() + timeout,
            options=options,
            token_ids=token_ids,
            pairs=pairs,
            held=self._wants_held(model),
            replies=True,  # a worker may answer a batch's requests of ours in one message
            spans=spans,
            images=images,
            cancel_key=os.urandom(16),  # known to us and the fleet's services only: no one else cancels it
            avoid=self._avoid(model),
        )
        payload = encode(request)
        if len(payload) + (HEADER_BYTES if current() is not None else 0) > self._nc.max_payload:
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                f"request is {len(payload)} bytes encoded; the NATS limit is {self._nc.max_payload}: "
                "send fewer or shorter inputs per request",
            )
        loop = asyncio.get_running_loop()
        pending = _Pending(request, loop.create_future())
        self._pending[request_id] = pending
        # the deadline as a timer on the future (asyncio.wait_for costs a task's worth of callbacks a request)
        timer = loop.call_later(timeout, pending.expire)
        answered = False
        try:
            await self._send(pending, request_id, None, payload)
            outcome = await pending.future
            answered = True
            return outcome
        except TimeoutError:
            if pending.parked:  # its rows were lost, and nothing serves the model to take them again
                raise ServiceError(ErrorCode.NO_RESPONDERS, _NOBODY) from None
            raise ServiceError(
                ErrorCode.TIMEOUT, f"no complete result within {timeout:g}s ({pending.rows}/{pending.total} rows)"
            ) from None
        finally:
            timer.cancel()
            del self._pending[request_id]
            if pending.resend_task is not None:  # answered, timed out or abandoned: no wait for a worker goes on
                pending.resend_task.cancel()
            for attempt in pending.attempts:
                self._attempts.pop(attempt, None)
                self._bundled.pop(attempt, None)
            if not answered:  # abandoned (the caller was cancelled: its client left), timed out or failed
                self._cancel(request)

    def _cancel(self, request: EmbedRequest) -> None:
        """Tell the model's tokenizers and workers that nobody reads ``request``'s answer: they drop its rows
        not yet sent or started. Published in the background: the caller may be a task being cancelled."""
        if request.cancel_key is None or not self._nc.is_connected:
            return
        payload = encode(Cancel(request.id, request.cancel_key, request.deadline))
        task = asyncio.ensure_future(self._nc.publish(self._subjects.cancel(request.model), payload))
        self._tasks.add(task)

        def sent(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:  # the connection went away: nothing to cancel
                log.debug("request %s: cancel not sent: %r", request.id, t.exception())

        task.add_done_callback(sent)

    def _wants_held(self, model: str) -> bool:
        """Whether to ask workers to say which rows they hold (a Held reply per worker batch): only that tells
        a dead worker's rows from the rows another worker holds, and only while the fleet has more than one
        worker of ``model``. With one, every missing row of its requests is lost with it anyway (those no
        worker holds yet too); without a fleet no rows are sent again."""
        return self._fleet is not None and self._fleet.workers(model) > 1

    def _avoid(self, model: str) -> tuple[str, ...]:
        """Workers of ``model`` the fleet watch took for stopped: a tokenizer may still route to them."""
        return () if self._fleet is None else self._fleet.silenced(model)

    async def _send(self, pending: _Pending, attempt: str, index: np.ndarray | None, payload: bytes) -> None:
        pending.attempts.append(attempt)
        self._attempts[attempt] = (pending, index)
        self._outbox.add(
            self._subjects.embed(pending.request.model),
            Item(f"{self._inbox}.{attempt}", payload, headers_for(pending.trace)),
        )

    def _carried(self, reply: str, replies: list[str]) -> None:
        self._bundled[reply.rsplit(".", 1)[-1]] = [r.rsplit(".", 1)[-1] for r in replies]

    def _unsent(self, replies: list[str], exc: Exception) -> None:
        """Requests whose publishing failed (the connection went away after they were made)."""
        for reply in replies:
            found = self._attempts.get(reply.rsplit(".", 1)[-1])
            if found is not None:
                found[0].fail(
                    ServiceError(
                        ErrorCode.NO_RESPONDERS,
                        "the NATS server became unreachable while the "
                        f"request was sent ({type(exc).__name__}); retry shortly",
                    )
                )

    async def _resend(self, pending: _Pending, why: str) -> bool:
        """Send ``pending``'s lost rows still missing as a new attempt; False when its retries or time ran out."""
        rows = np.flatnonzero(pending.lost & ~pending.filled)
        pending.lost[:] = False
        if pending.future.done() or not len(rows):
            return True
        if len(pending.attempts) > self._retries or pending.request.deadline - time.time() < 0.05:
            return False
        attempt = f"{pending.id}-{len(pending.attempts)}"
        log.info(
            "request %s: %s; sending its %d missing rows again (attempt %d)",
            pending.id,
            why,
            len(rows),
            len(pending.attempts) + 1,
        )
        index = None if len(rows) == pending.total else rows  # all rows: their places are unchanged
        try:
            # the worker that lost them may still look live to the tokenizers: the request names it (and
            # any other taken for stopped) for them to pass over
            subset = replace(_subset(pending.request, attempt, rows), avoid=self._avoid(pending.request.model))
            await self._send(pending, attempt, index, encode(subset))
        except Exception as exc:  # the connection went away meanwhile: the connection watch fails it
            log.warning("request %s: resend failed: %s", pending.id, exc)
        return True

    def resend_missing(self, role: str, instance: str, model: str | None = None) -> None:
        """A process of the fleet serving ``model`` (None: any) died: every request of that model in flight
        may have lost rows with it.

        Out of retries, a request still completes if its rows come, or times out at its deadline."""
        for pending in list(self._pending.values()):
            if model is not None and pending.request.model != model:
                continue
            # a resend under way sends these rows too (or goes again for them)
            if pending.lose(role, instance) and not pending.future.done() and not pending.resending:
                self._spawn(self._when_served(pending, f"{role} {instance} died", None), pending)

    async def _when_served(self, pending: _Pending, why: str, lost_at: float | None) -> None:
        """Send ``pending``'s missing rows again once its model is served. ``lost_at``: when (monotonic)
        its latest attempt found nobody to take them (None: a process died, they may be lost): then
        only a look at the fleet taken after that counts, and out of retries the request fails (503)."""
        model = pending.request.model
        if self._fleet is None:
            pending.fail(ServiceError(ErrorCode.NO_RESPONDERS, _NOBODY))
            return
        if lost_at is not None or not self._fleet.serves(model):
            pending.parked = True
            until = time.monotonic() + pending.request.deadline - time.time() - _GIVE_UP_BEFORE
            served = await self._fleet.wait_serving(model, time.monotonic() if lost_at is None else lost_at, until)
            pending.parked = False
            if not served:
                pending.fail(ServiceError(ErrorCode.NO_RESPONDERS, _NOBODY))
                return
        while (pending.lost & ~pending.filled).any():  # more were lost meanwhile: they go too
            if not await self._resend(pending, why) and lost_at is not None:
                pending.fail(ServiceError(ErrorCode.NO_RESPONDERS, _NOBODY))

    def _spawn(self, work, pending: _Pending) -> None:
        """Run ``work`` (a resend) in the background, one at a time per request."""
        pending.resending = True
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        pending.resend_task = task

        def done(t: asyncio.Task) -> None:
            pending.resending = False
            pending.resend_task = None
            self._tasks.discard(t)

        task.add_done_callback(done)

    def _check_connected(self) -> None:
        if not self._nc.is_connected:
            raise ServiceError(ErrorCode.NO_RESPONDERS, "the NATS server is unreachable right now; retry shortly")

    def _watch_connection(self) -> None:
        """Fail what is in flight as soon as the connection drops: its replies would be lost. nats-py calls
        its disconnected callback once the socket is closed (a reconnect begins, or the client closes), its
        status already not connected, so no request starts after it; ours goes before the one the
        connection was made with (embedfleet.shared.nats.lifecycle.connect), which still runs."""
        self._watching = True
        if self._hooked:
            return  # started again: the chain holds this client's callback already
        previous = self._nc._disconnected_cb  # nats-py keeps one; connect() takes it, no public setter

        async def on_disconnect() -> None:
            if self._watching and not self._nc.is_connected and self._pending:
                error = ServiceError(ErrorCode.NO_RESPONDERS, "lost the connection to the NATS server; retry shortly")
                for pending in list(self._pending.values()):
                    pending.fail(error)
            if previous is not None:
                await previous()

        self._nc._disconnected_cb = on_disconnect
        self._hooked = True

    async def tokenize(
        self, model: str, texts: list[str], add_special_tokens: bool, prompt_name: str | None, timeout: float
    ) -> TokenizeResult:
        """Ask a tokenizer how ``texts`` tokenize."""
        request = TokenizeRequest(uuid.uuid4().hex, model, texts, add_special_tokens, prompt_name)
        reply = await self._ask(self._subjects.tokenize(model), encode(request), "tokenizer", timeout, len(texts))
        if not isinstance(reply, TokenizeResult) or len(reply.tokens) != len(texts):
            raise ServiceError(ErrorCode.INTERNAL, "a tokenizer sent an unexpected reply")
        return reply

    async def decode(self, model: str, ids: list[np.ndarray], skip_special_tokens: bool, timeout: float) -> list[str]:
        """Ask a tokenizer for the text of each sequence of token IDs."""
        request = DecodeRequest(uuid.uuid4().hex, model, ids, skip_special_tokens)
        payload = self._within_limit(encode(request), "send fewer token IDs per request")
        reply = await self._ask(self._subjects.decode(model), payload, "tokenizer", timeout, len(ids))
        if not isinstance(reply, DecodeResult) or len(reply.texts) != len(ids):
            raise ServiceError(ErrorCode.INTERNAL, "a tokenizer sent an unexpected reply")
        return reply.texts

    async def chunk(
        self, model: str, texts: list[str], spec: ChunkSpec, options: EmbedOptions, timeout: float
    ) -> ChunkLayout:
        """Ask a tokenizer where ``texts`` are cut into chunks of ``spec``, each with room for the prompt
        ``options`` name (the chunks' texts are then embedded with those options)."""
        request = ChunkRequest(
            uuid.uuid4().hex, model, texts, spec, options.prompt_name, options.input_type, options.task
        )
        payload = self._within_limit(encode(request), "send fewer or shorter texts per request")
        reply = await self._ask(self._subjects.chunk(model), payload, "tokenizer", timeout, len(texts))
        if not isinstance(reply, ChunkLayout) or len(reply.counts) != len(texts):
            raise ServiceError(ErrorCode.INTERNAL, "a tokenizer sent an unexpected reply")
        return reply

    def _within_limit(self, payload: bytes, fewer: str) -> bytes:
        """``payload``, refused (what to send instead: ``fewer``) when it is over the NATS limit."""
        if len(payload) > self._nc.max_payload:
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                f"request is {len(payload)} bytes encoded; the NATS limit is {self._nc.max_payload}: {fewer}",
            )
        return payload

    async def rerank(self, request: RerankRequest, timeout: float) -> RerankResult:
        """Ask a scorer to rank ``request``'s candidates (one deadline for the whole rerank)."""
        reply = await self._ask(
            self._subjects.rerank(request.model), encode(request), "scorer", timeout, request.count, "candidate"
        )
        if (
            not isinstance(reply, RerankResult)
            or len(reply.indices) > request.count
            or (len(reply.indices) and (reply.indices.min() < 0 or reply.indices.max() >= request.count))
        ):
            raise ServiceError(ErrorCode.INTERNAL, "a scorer sent an unexpected reply")
        return reply

    async def _ask(self, subject: str, payload: bytes, who: str, timeout: float, rows: int, noun: str = "input"):
        """One request-reply to a ``who`` service about ``rows`` inputs (named ``noun`` in errors): its reply
        decoded, or its error raised."""
        self._check_connected()
        try:
            msg = await self._nc.request(subject, payload, timeout=timeout, headers=headers_for(current()))
        except NoRespondersError:
            raise ServiceError(ErrorCode.NO_RESPONDERS, f"no {who} is serving this model right now") from None
        except TimeoutError:
            raise ServiceError(ErrorCode.TIMEOUT, f"no answer from a {who} within {timeout:g}s") from None
        try:
            reply = decode(msg.data)
            error = reply_error(reply, rows, noun=noun) if isinstance(reply, ErrorReply) else None
        except ProtocolError:
            raise ServiceError(ErrorCode.INTERNAL, f"a {who} sent a malformed reply") from None
        if error is not None:
            raise error
        return reply

    def _nobody_took(self, pending: _Pending, attempt: str, why: str) -> None:
        """An attempt's rows reached nobody: sent again once the model is served (one answer per attempt:
        several of its chunks may each find nobody; an older attempt's answer is stale)."""
        if pending.future.done() or attempt != pending.attempts[-1]:
            return
        pending.lost |= True  # conservatively: every row still missing (a resend under way takes them along)
        if not pending.resending:
            self._spawn(self._when_served(pending, why, time.monotonic()), pending)

    async def _on_reply(self, msg: Msg) -> None:
        attempt = msg.subject.rsplit(".", 1)[-1]
        found = self._attempts.get(attempt)
        if msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
            for each in self._bundled.get(attempt, (attempt,)):  # a Requests message: every request in it
                if (taken := self._attempts.get(each)) is not None:
                    self._nobody_took(taken[0], each, "no tokenizer took it")
            return
        try:
            reply = decode(msg.data)
        except ProtocolError as exc:
            if found is not None:
                log.error("request %s: bad reply: %s", found[0].id, exc)
                found[0].fail(ServiceError(ErrorCode.INTERNAL, "a worker sent a malformed reply"))
            return
        if not isinstance(reply, Replies):
            self._take(attempt, reply)
            return
        prefix = f"{self._inbox}."  # a worker's replies to several of our requests
        for subject, payload in zip(reply.subjects, reply.messages):
            if subject.startswith(prefix):
                self._take(subject[len(prefix) :], payload)

    def _take(self, attempt: str, reply: object | bytes) -> None:
        """One reply to attempt ``attempt`` (or its bytes, from a Replies): rows, rows held, or an error."""
        found = self._attempts.get(attempt)
        if found is None:
            return  # late reply for a request that already finished or timed out
        pending, index = found
        try:
            reply = decode(reply) if isinstance(reply, bytes) else reply
            if isinstance(reply, ErrorReply) and reply.code is ErrorCode.NO_RESPONDERS:
                self._nobody_took(pending, attempt, "no worker took its rows")  # a tokenizer found none
            elif isinstance(reply, ErrorReply):
                pending.fail(reply_error(reply, pending.total if index is None else len(index), index))
            elif isinstance(reply, EmbedResult):
                pending.add(reply, index)
            elif isinstance(reply, Held):
                pending.hold(reply, index)
            else:
                raise ProtocolError(f"unexpected {type(reply).__name__} on a reply subject")
        except ProtocolError as exc:
            log.error("request %s: bad reply: %s", pending.id, exc)
            pending.fail(ServiceError(ErrorCode.INTERNAL, "a worker sent a malformed reply"))
