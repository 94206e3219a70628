"""``POST /v1/jobs`` with ``"sink": URL``: the gateway collects the job's results and writes them into a
vector store (shared/jobs/sink_writer.py, as ``embedfleet reindex --sink`` does), so a job submitted over
HTTP ends in the store, not only in the results stream.

Which stores: the gateway's ``--job-sinks`` names them, with their credentials; a request's URL must
name one of them (same scheme, host, port, database or folder, and other parameters), choosing only
its table (``table``, Qdrant's ``collection``) and ``index``, and carries no password. A gateway
without ``--job-sinks`` writes into none. So a client can neither point the gateway at a host of its
choosing nor learn a password, and a refusal names none of the allowed stores (their hosts, folders,
users). With API keys the table must be one the request's key may use (services/gateway/tenants.py:
403 otherwise), its name checked before the store is connected to.

Who writes: one gateway at a time, holding the job's lease in its state (``sink_lease``: who, and
until when), renewed every ``LEASE / 3`` seconds. Every gateway with ``--job-sinks`` looks for sink
jobs whose lease has run out (their gateway died or was stopped) every ``ADOPT_EVERY`` seconds and
takes them over: the results are read again from the start of the stream and upserted again (a
repeat writes nothing twice), with the rows' fields and texts read back from the results stream
(shared/jobs/sources.py). Nothing a job stored is lost while its results are kept.

State fields (shared/jobs/state.py): ``sink`` (the store as shown, no password), ``sink_target`` (the
request's URL), ``sink_shape``, ``sink_lease``, and the writer's ``sink_rows``, ``sink_error``,
``sink_done``; a store that refuses the rows for good (another table's dimension) ends the writing
with ``sink_failed`` (the job stays unfinished; a new job writes elsewhere).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import replace
from functools import partial
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.tenants import TableAccess
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.jobs.bucket import has_state_key, read_state, update_state
from embedfleet.shared.jobs.collector import Collector, Layout
from embedfleet.shared.jobs.publish import JobSink
from embedfleet.shared.jobs.sink_writer import SinkWriter, Sources
from embedfleet.shared.jobs.sources import SourcesLost, parts_of, publish_sources, read_sources
from embedfleet.shared.jobs.state import CANCELLED, JobState, JobStateError, Lease
from embedfleet.shared.jobs.streams import stream_names
from embedfleet.shared.sinks import Shape, Sink, SinkError, sink_for

log = logging.getLogger("embedfleet.gateway.sinks")

LEASE = 15.0  # seconds a gateway holds a job's writing without renewing it
ADOPT_EVERY = 5.0  # seconds between looks for sink jobs no gateway writes
STATE_EVERY = 1.0  # seconds between reads of a written job's state (is it all stored, cancelled?)
RETRY_AFTER = 5  # seconds a client is told to wait before submitting a job whose store is down or busy again
CHOSEN = ("table", "collection", "index")  # what a request's URL may choose within an allowed store
_SCHEMES = {"postgres": "postgresql"}  # one scheme, two names


class LeaseHeld(Exception):
    """Another gateway writes this job."""


def _store_of(url: str) -> tuple:
    """What names the store, apart from the table a request may choose and the credentials."""
    parts = urlsplit(url)
    params = sorted((k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in CHOSEN)
    return (_SCHEMES.get(parts.scheme, parts.scheme), (parts.hostname or "").lower(), parts.port, parts.path, params)


class SinkTargets:
    """The stores ``--job-sinks`` allows, a request's URL resolved against them, and the tables in them
    each API key may write (``access``, services/gateway/tenants.py; None: every table)."""

    def __init__(self, allowed: tuple[str, ...], access: TableAccess | None = None) -> None:
        self._allowed = allowed
        self._access = access or TableAccess()

    def granted(self, given: str) -> str:
        """``resolve``'s URL, once its table is a plain name (400) the request's key may use (403): checked
        before the store is connected to, so nothing is made for a request refused."""
        url = self.resolve(given)
        try:
            table = sink_for(url).table_name
        except SinkError as exc:
            raise ApiError(ErrorCode.INVALID_REQUEST, exc.message, "sink") from None
        self._access.check(table, "sink")
        return url

    def __bool__(self) -> bool:
        return bool(self._allowed)

    def resolve(self, given: str) -> str:
        """The URL to open for the request's ``given``: the allowed store's, with the request's choice
        of table and index. ApiError (400) for a store not allowed or a URL with a password."""
        if not self._allowed:
            raise ApiError(
                ErrorCode.INVALID_REQUEST,
                "jobs are not written into stores here (the gateway's "
                "--job-sinks is not set): leave 'sink' out, and read the vectors from the results route",
                "sink",
            )
        try:
            parts = urlsplit(given)
            port_ok = parts.port is None or parts.port > 0
        except ValueError as exc:
            raise ApiError(ErrorCode.INVALID_REQUEST, f"'sink' is not a URL: {exc}", "sink") from None
        if parts.password:  # libpq URLs may say "user:@host": an empty one is none
            raise ApiError(
                ErrorCode.INVALID_REQUEST,
                "'sink' must carry no password: the gateway holds the stores' credentials (--job-sinks)",
                "sink",
            )
        wanted = _store_of(given)
        for allowed in self._allowed:
            if port_ok and _store_of(allowed) == wanted and (parts.username in (None, urlsplit(allowed).username)):
                base = urlsplit(allowed)
                params = [(k, v) for k, v in parse_qsl(base.query, keep_blank_values=True) if k not in CHOSEN]
                params += [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k in CHOSEN]
                # by hand: urlunsplit drops the "//" of an empty host (lancedb:///PATH, libpq's sockets)
                return f"{base.scheme}://{base.netloc}{base.path}?{urlencode(params, safe='/')}"
        # which of the gateway's stores (their hosts, folders, users) is never told: only what was not allowed
        scheme = _SCHEMES.get(parts.scheme, parts.scheme)
        if not any(_store_of(a)[0] == scheme for a in self._allowed):
            raise ApiError(
                ErrorCode.INVALID_REQUEST,
                f"'sink' names a store this gateway does not write into: it writes into no "
                f"{scheme + '://' if scheme else 'such'} store",
                "sink",
            )
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"'sink' names a {scheme}:// store this gateway does not write into: name one of its --job-sinks "
            "stores as given to you, without a password (a table of your choice: ?table=NAME, Qdrant's "
            "?collection=NAME)",
            "sink",
        )


def sink_shown(url: str) -> str:
    """A URL as logs and answers show it: its password as ***."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


class SinkJobs:
    """The sink jobs this gateway writes, and the look-out for those no gateway writes."""

    def __init__(self, js, kv, subjects, targets: SinkTargets, max_payload: int) -> None:
        self._js, self._kv, self._subjects = js, kv, subjects
        self.targets = targets
        self._max_payload = max_payload
        self._name = uuid.uuid4().hex[:12]  # this gateway, as leases name it
        self._writing: dict[str, asyncio.Task] = {}
        self._refused: set[str] = set()  # jobs whose store this gateway may not write into (said once)
        self._looking: asyncio.Task | None = None

    def start(self) -> None:
        if self.targets:
            self._looking = asyncio.create_task(self._look_out())

    async def stop(self) -> None:
        """Stop writing; the leases are handed back, so another gateway takes the jobs over at once."""
        tasks = [t for t in (self._looking, *self._writing.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def open(self, given: str, shape: Shape) -> tuple[str, Sink]:
        """The store a request names, its table made or checked for ``shape``: 400 for a store that
        cannot take the job's rows (another dimension), 503 for one down (try again later)."""
        url = self.targets.granted(given)
        try:
            sink = sink_for(url)
        except SinkError as exc:
            raise ApiError(ErrorCode.INVALID_REQUEST, exc.message, "sink") from None
        try:
            await asyncio.to_thread(sink.open, shape)
        except SinkError as exc:
            await asyncio.to_thread(sink.close)
            if exc.retryable:
                raise ApiError(
                    ErrorCode.NO_RESPONDERS,
                    f"{exc.message}; nothing was published: submit the job again later",
                    "sink",
                    retry_after=RETRY_AFTER,
                ) from None
            raise ApiError(ErrorCode.INVALID_REQUEST, f"{exc.message}; nothing was published", "sink") from None
        return given, sink

    def record(self, given: str, sink: Sink, shape: Shape) -> JobSink:
        """What the job's first state holds of its store (shared/jobs/publish.py's submit ``sink``): the
        lease is this gateway's from the start."""
        return JobSink(sink.shown, given, shape, self._lease())

    def sources_messages(self, ids: list[str], sources: Sources) -> list[bytes]:
        try:
            return parts_of(ids, sources, self._max_payload)
        except ValueError as exc:
            raise ApiError(ErrorCode.PAYLOAD_TOO_LARGE, str(exc), "documents") from None

    async def keep(self, job: str, messages: list[bytes]) -> None:
        """The rows' sources into the results stream, before the job is: a gateway that takes it over finds them."""
        await publish_sources(self._js, self._subjects, job, messages)

    def write(self, job: str, sink: Sink, shape: Shape, sources: Sources, layout: Layout | None) -> None:
        """Write a job just submitted (its lease taken with its first state) in the background."""
        if job in self._writing:  # the same request again while this gateway writes it
            asyncio.create_task(asyncio.to_thread(sink.close))  # noqa: RUF006 (the executor's future holds the task until closed)
            return
        self._writing[job] = task = asyncio.create_task(self._write(job, sink, shape, sources, layout))
        task.add_done_callback(partial(self._written, job))

    def _written(self, job: str, _task: asyncio.Task) -> None:
        self._writing.pop(job, None)

    # -- the lease ------------------------------------------------------------------------------

    def _lease(self) -> Lease:
        return Lease(self._name, time.time() + LEASE)

    async def _hold(self, job: str) -> JobState:
        """Take or renew the job's lease; LeaseHeld when another gateway's runs."""

        def take(state: JobState) -> JobState:
            if not state.sink_target:  # not recorded (yet, or no more): nothing to write
                raise LeaseHeld(job)
            lease = state.sink_lease
            if lease is not None and lease.by != self._name and lease.until > time.time():
                raise LeaseHeld(job)
            return replace(state, sink_lease=self._lease())

        return await update_state(self._kv, job, take)

    async def _release(self, job: str) -> None:
        def release(state: JobState) -> JobState:
            mine = state.sink_lease is not None and state.sink_lease.by == self._name
            return replace(state, sink_lease=None) if mine else state

        try:
            await update_state(self._kv, job, release, patience=5.0)
        except Exception as exc:  # it runs out by itself
            log.debug("job %s: lease not handed back: %r", job, exc)

    # -- writing ----------------------------------------------------------------------------------

    async def _write(self, job: str, sink: Sink, shape: Shape, sources: Sources, layout: Layout | None) -> None:
        collector = Collector(
            self._js,
            job,
            layout,
            self._subjects.results(job),
            stream_names(self._subjects)["results"],
            shape.form,
            chunked=shape.chunked,
        )
        writer = SinkWriter(sink, self._kv, job, sources, keep_vectors=False, said=lambda _text: None)
        try:
            await collector.open()
            renewed = checked = time.monotonic()
            state: JobState | None = None
            while True:
                await collector.poll()
                writer.add(collector.take_fresh(), collector)
                await writer.flush(collector)
                now = time.monotonic()
                if now - renewed >= LEASE / 3:
                    state, renewed = await self._hold(job), now
                elif now - checked >= STATE_EVERY:
                    state = await read_state(self._kv, job)
                else:
                    continue
                checked = now
                if state is None:
                    log.info("job %s: purged; %d rows were written into %s", job, writer.rows, sink.shown)
                    return
                if state.status == CANCELLED:
                    log.info("job %s: cancelled; %d rows were written into %s", job, writer.rows, sink.shown)
                    return
                if _all_read(state, collector.documents):
                    await writer.flush(collector, final=True)
                    await writer.finish()
                    log.info("job %s: %d rows in %s", job, writer.rows, sink.shown)
                    return
        except LeaseHeld:
            log.info("job %s: another gateway writes it now", job)
        except SinkError as exc:  # not retryable: the store will never take these rows
            log.error("job %s: the store %s refused its rows for good: %s", job, sink.shown, exc.message)
            failed = exc.message[:500]
            await update_state(self._kv, job, lambda s: replace(s, sink_failed=failed))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("job %s: writing into %s stopped; another look takes it up again", job, sink.shown)
        finally:
            await collector.close()
            await asyncio.to_thread(sink.close)
            await self._release(job)

    async def _look_out(self) -> None:
        """Every ``ADOPT_EVERY`` seconds: the sink jobs no gateway writes, taken over."""
        while True:
            try:
                await self._adopt_all()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the server away: the next look
                log.debug("sink jobs look-out: %r", exc)
            await asyncio.sleep(ADOPT_EVERY)

    async def _adopt_all(self) -> None:
        from nats.js.errors import NoKeysError

        try:
            keys = await self._kv.keys()
        except NoKeysError:
            return
        for job in keys:
            if job in self._writing or job in self._refused or not has_state_key(job):
                continue
            try:
                state = await read_state(self._kv, job)
            except JobStateError as exc:  # not one this code wrote: never taken over
                self._refused.add(job)
                log.warning("%s: not taken over", exc)
                continue
            if state is None or not _unwritten(state):
                continue
            if state.sink_lease is not None and state.sink_lease.until > time.time():
                continue
            await self._adopt(job, state)

    async def _adopt(self, job: str, state: JobState) -> None:
        try:
            url = self.targets.resolve(state.sink_target or "")
        except ApiError as exc:
            self._refused.add(job)
            log.warning("job %s: its store %s is not one this gateway writes into: %s", job, state.sink, exc.message)
            return
        shape = state.sink_shape
        if shape is None:  # recorded by every gateway that writes a job (SinkJobs.record): another writer's job
            self._refused.add(job)
            log.warning("job %s: its store %s has no rows' shape recorded: not taken over", job, state.sink)
            return
        try:
            await self._hold(job)
        except LeaseHeld:
            return
        try:
            sources = await read_sources(self._js, self._subjects, job, self._max_payload)
            sink = sink_for(url)
            await asyncio.to_thread(sink.open, shape)
        except (SourcesLost, SinkError) as exc:
            log.warning("job %s: not taken over now: %s", job, getattr(exc, "message", exc))
            await self._release(job)
            return
        log.info("job %s: writing into %s taken over (its gateway stopped)", job, sink.shown)
        self._writing[job] = task = asyncio.create_task(self._write(job, sink, shape, sources, None))
        task.add_done_callback(partial(self._written, job))


def _unwritten(state: JobState) -> bool:
    """A sink job whose rows are not all in its store yet, and may still be written."""
    return (
        bool(state.sink_target) and state.sink_done is None and state.sink_failed is None and state.status != CANCELLED
    )


def _all_read(state: JobState, read: int) -> bool:
    """Every document settled (stored or given up), and every stored one read by the collector."""
    total = state.documents or 0
    return bool(total) and state.done + state.failed >= total and read >= state.done
