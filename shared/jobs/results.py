"""A finished job's vectors, read back from the results stream (``<prefix>.v1.results.<job>``) a few
results at a time: what ``GET /v1/jobs/{id}/results`` streams and ``embedfleet jobs fetch`` writes.

A result holds the rows of one part of one job batch (``JobResult``: batch, first row, document ids).
The reader goes once through what the stream holds for the job when it starts, in the order it was
stored (batches finish in any order), through an ephemeral consumer of its own that acknowledges
nothing, so it changes nothing and any number of readers may run at once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from embedfleet.shared.jobs.state import FINISHED, JobState
from embedfleet.shared.jobs.streams import stream_names
from embedfleet.shared.jobs.work_queue import close_pull
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import ChunkRows, JobResult, ProtocolError, decode_as
from embedfleet.shared.text_chunks import JobChunking
from embedfleet.shared.vectors.forms import FORMS

log = logging.getLogger("embedfleet.job_results")

FETCH = 16  # results a fetch asks for: at most ~16 MB held (a result is under NATS's max payload)
FETCH_WAIT = 5.0  # seconds a fetch waits for results the stream said it holds
# seconds the server keeps a reader's consumer without a fetch (a client that stopped reading); one
# lost meanwhile, or with a server that restarted, is opened again after the last result read
INACTIVE = 60.0
REOPENS = 3  # consumers lost in a row before the reader gives up


@dataclass(frozen=True, slots=True)
class JobForm:
    """What a job's rows are: ``form`` (shared/vectors/forms.py) and ``output`` (dense, sparse, multivector);
    ``chunking`` (None: a row a document): a row a chunk, with its place."""

    form: str
    output: str
    chunking: JobChunking | None = None

    @classmethod
    def of(cls, state: JobState) -> JobForm:
        """The form a submitted job's state records."""
        assert state.embedding_type is not None and state.output is not None, "a submission records the form"
        return cls(state.embedding_type, state.output, state.chunking)

    @property
    def with_text(self) -> bool:
        return self.chunking is not None and self.chunking.with_text

    @property
    def wire(self) -> str:
        return FORMS[self.form].wire


@dataclass(frozen=True, slots=True)
class Stored:
    """One stored result's rows: dense [n, width] of the form's type; sparse a list of (indices,
    values); multivector a list of [tokens, width] arrays. ``batch`` and ``start`` place them in the
    job's input (batch b's row r is document b·batch_size + start + r)."""

    batch: int
    start: int
    doc_ids: list[str]
    rows: np.ndarray | list
    dim: int
    chunks: ChunkRows | None = None  # a chunked job's: the chunk each row is (doc_ids: each row's document)


def result_rows(result: JobResult) -> np.ndarray | list:
    """A result's rows as ``Stored.rows`` holds them."""
    return result.ragged() if result.offsets is not None else result.array()


def unfinished(state: JobState) -> str | None:
    """Why a job's results cannot be read as a whole yet (None: they can): it has not finished."""
    if state.status in FINISHED:
        return None
    return (
        f"job {state.job} is {state.status or 'not started'}: {state.done + state.failed} of "
        f"{state.documents if state.documents is not None else '?'} documents settled; its results can be read once "
        "it is done"
    )


def expired(state: JobState) -> str:
    """Why a job whose stream holds none of its results has none to give."""
    return (
        f"job {state.job} stored {state.done} documents' vectors, and the results stream holds none of them "
        "any more (expired: --results-max-age, --results-max-bytes)"
    )


class StoredResults:
    """A job's results as stored, read once from the first to the last stored when ``open`` ran.

    Results naming another job, or of another form or dimension than the job's first, are not the
    job's rows (a client publishing into the subject): left out, with a log line. A part of a batch stored twice (after the
    stream's duplicate window) is read once."""

    def __init__(self, js: JetStreamContext, subjects: Subjects, job: str, form: JobForm) -> None:
        self._js, self._job, self._form = js, job, form
        self._subject = subjects.results(job)
        self._stream = stream_names(subjects)["results"]
        self._psub: JetStreamContext.PullSubscription | None = None
        self._last = 0  # stream sequence of the last result read
        self.stored = 0  # messages the stream held for the job when opened
        self.dim = 0  # components per row, from the first result read

    async def open(self) -> int:
        """Count the job's stored results and, when there are some, open the consumer; returns the count."""
        info = await self._js.stream_info(self._stream, subjects_filter=self._subject)
        self.stored = (info.state.subjects or {}).get(self._subject, 0)
        if self.stored:
            await self._subscribe()
        return self.stored

    async def _subscribe(self) -> None:
        start = (
            dict(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self._last + 1)
            if self._last
            else dict(deliver_policy=DeliverPolicy.ALL)
        )
        self._psub = await self._js.pull_subscribe(
            self._subject,
            stream=self._stream,
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, inactive_threshold=INACTIVE, **start),
        )

    async def close(self) -> None:
        """Unsubscribe and delete the consumer (left, the server would keep it ``INACTIVE`` seconds)."""
        if self._psub is None:
            return
        psub, self._psub = self._psub, None
        try:
            await self._js.delete_consumer(self._stream, psub._consumer)  # nats-py keeps the consumer's name there
        except Exception as exc:  # gone already, or the server is away: it expires by itself
            log.debug("job %s: results consumer not deleted: %r", self._job, exc)
        await close_pull(psub)

    async def __aiter__(self) -> AsyncIterator[Stored]:
        seen: set[tuple[int, int]] = set()  # (batch, start) of the parts read: a few per batch, not per row
        async for result in self._results():
            if (result.batch, result.start) in seen or not self._fits(result):
                continue
            seen.add((result.batch, result.start))
            self.dim = result.dim
            yield Stored(
                result.batch, result.start, list(result.doc_ids), result_rows(result), result.dim, result.chunks
            )

    async def _results(self) -> AsyncIterator[JobResult]:
        """Every result the stream held at ``open``: until the consumer has none pending."""
        pending = self.stored
        while self._psub is not None and pending:
            for msg in await self._fetch(pending):
                self._last = msg.metadata.sequence.stream
                pending = msg.metadata.num_pending
                try:
                    yield decode_as(msg.data, JobResult)
                except ProtocolError as exc:
                    log.warning("job %s: a stored result is not one (%s): left out", self._job, exc)

    async def _fetch(self, pending: int) -> list:
        """The next results; a consumer lost (inactive too long, a server restarted) is opened again
        after the last result read, ``REOPENS`` times in a row at most."""
        from nats.errors import TimeoutError as NatsTimeoutError

        unread = f"with {pending} of its {self.stored} results unread"
        for _ in range(REOPENS):
            assert self._psub is not None  # open, and opened again below
            try:
                return await self._psub.fetch(FETCH, timeout=FETCH_WAIT)
            except (TimeoutError, NatsTimeoutError):
                if await self._still_there():  # there, and nothing came: the results went meanwhile
                    raise ResultsLost(f"job {self._job}: the results stream stopped answering {unread}") from None
                why = "gone"
            except Exception as exc:
                why = repr(exc)
            log.info("job %s: results consumer lost (%s): opening it again after result %d", self._job, why, self._last)
            try:
                await self.close()
                await self._subscribe()
            except Exception as exc:
                raise ResultsLost(
                    f"job {self._job}: its results consumer cannot be opened again ({exc!r}) {unread}"
                ) from None
        raise ResultsLost(f"job {self._job}: its results consumer was lost {REOPENS} times in a row {unread}")

    async def _still_there(self) -> bool:
        if self._psub is None:  # closed meanwhile: gone as well
            return False
        try:
            await self._psub.consumer_info()
            return True
        except Exception:
            return False

    def _fits(self, result: JobResult) -> bool:
        if result.id != self._job:
            log.error("a result of job %r in the subject of job %r: left out", result.id[:100], self._job)
            return False
        if (result.chunks is None) != (self._form.chunking is None):
            log.error(
                "job %s batch %d: %s rows in a job of %s rows: left out",
                self._job,
                result.batch,
                "document" if result.chunks is None else "chunk",
                "chunk" if self._form.chunking else "document",
            )
            return False
        if result.dtype == self._form.wire and (not self.dim or result.dim == self.dim):
            return True
        log.error(
            "job %s batch %d: %s rows of dimension %d in a job of %s rows%s: left out",
            self._job,
            result.batch,
            result.dtype,
            result.dim,
            self._form.wire,
            f" of dimension {self.dim}" if self.dim else "",
        )
        return False


class ResultsLost(Exception):
    """The stream stopped giving results it said it held (they expired meanwhile, or the server went)."""
