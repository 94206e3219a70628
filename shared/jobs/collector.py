"""A bulk job's results as ``embedfleet reindex`` collects them: read from the results stream through a
consumer of their own, every document's vectors once (a chunked job's: every chunk of every document
once, shared/jobs/chunks.py), and which of them this run stored."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from embedfleet.shared.config.registry import default
from embedfleet.shared.jobs.batches import batch_starts
from embedfleet.shared.jobs.chunks import ChunkedRows
from embedfleet.shared.jobs.documents import Document
from embedfleet.shared.jobs.work_queue import close_pull
from embedfleet.shared.protocol import JobResult, ProtocolError, decode_as
from embedfleet.shared.vectors.forms import WIRE_FORMS, vector_form

log = logging.getLogger("embedfleet.jobs.collector")


@dataclass(frozen=True, slots=True)
class Polled:
    """Documents whose vectors a poll read for the first time (a chunked job's: whose chunks are now all
    read): ``earlier`` of them stored by an earlier run of the job (read again on resuming), ``now``
    during this run, with their ``tokens``. A rate counts only these. ``chunks``: the chunks read for
    the first time, of either run."""

    earlier: int = 0
    now: int = 0
    tokens: int = 0
    chunks: int = 0

    def plus(self, docs: int, tokens: int, earlier: bool, chunks: int = 0) -> Polled:
        if earlier:
            return Polled(self.earlier + docs, self.now, self.tokens, self.chunks + chunks)
        return Polled(self.earlier, self.now + docs, self.tokens + tokens, self.chunks + chunks)

    def __add__(self, other: Polled) -> Polled:
        return Polled(
            self.earlier + other.earlier, self.now + other.now, self.tokens + other.tokens, self.chunks + other.chunks
        )


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a job's documents are: its ids in input order, batch b being documents ``starts[b]`` ..
    ``starts[b + 1]`` (shared/jobs/batches.py cuts them). A result holds the rows of documents
    starts[b] + start ... of batch b; one that names others is not this job's (a client publishing into
    the job's subject)."""

    ids: list[str]
    starts: list[int]

    @classmethod
    def of(cls, docs: Sequence[Document], batch_size: int, batch_bytes: int = 0) -> Layout:
        """The layout of ``docs`` cut as their job's publisher cuts them."""
        return cls([d for d, _ in docs], batch_starts(docs, batch_size, batch_bytes))

    def holds(self, result: JobResult) -> bool:
        if not 0 <= result.batch < len(self.starts) - 1:
            return False
        base, size = self.starts[result.batch], self.starts[result.batch + 1] - self.starts[result.batch]
        if result.chunks is not None:  # rows are chunks: each names its document's row in the batch
            return result.chunks.documents <= size and all(
                d < size and self.ids[base + d] == doc_id
                for d, doc_id in zip(result.chunks.doc.tolist(), result.doc_ids)
            )
        first = base + result.start
        return (
            result.start >= 0
            and result.start + len(result.doc_ids) <= size
            and self.ids[first : first + len(result.doc_ids)] == list(result.doc_ids)
        )


class Collector:
    """Reads a job's results from the start of the stream (results collected before a crash are read
    again) through a consumer of its own, kept in as many copies as the stream (a NATS node's loss
    leaves it to the others). When the consumer is lost (a restarted server, a quiet spell with no
    answer) it is opened again after the last result read, so nothing is read twice or missed.

    Rows are kept as they came, in the job's ``form`` (shared/vectors/forms.py); a result naming another
    job or other documents than ``layout`` puts there (published into this job's subject by a client),
    of another form or of another dimension than the first result's, or with chunks in a job without
    (or none in a ``chunked`` one), cannot belong to this job's output and is refused."""

    def __init__(
        self,
        js,
        job: str,
        layout: Layout | None,
        subject: str,
        stream: str,
        form: str = "float32",
        quiet_check: float = default("results_check"),
        chunked: bool = False,
    ) -> None:
        self._js, self._job, self._layout, self._subject, self._stream = js, job, layout, subject, stream
        self._fetch_wait = min(1.0, quiet_check)  # seconds a fetch waits for results
        # fetches in a row without a result before the consumer is asked whether it is there
        self._quiet_check = max(1, round(quiet_check / self._fetch_wait))
        self._psub: JetStreamContext.PullSubscription | None = None
        self._last = 0  # stream sequence of the last result read
        self._before: int | None = (
            None  # the stream's last sequence when this run began: results up to it are an earlier run's
        )
        self._quiet = 0
        self.form = vector_form(form)
        self.dim = 0  # components per row, from the first result
        self.got: dict[str, np.ndarray] = {}  # doc id -> [form.width(dim)]
        self.chunks: ChunkedRows | None = ChunkedRows() if chunked else None  # a chunked job's rows
        self._fresh: list[str] = []  # documents (of a job without chunks) completed since ``take_fresh``

    @property
    def documents(self) -> int:
        """Documents whose vectors are all here."""
        return self.chunks.complete if self.chunks is not None else len(self.got)

    def take_fresh(self) -> list[str]:
        """The documents whose vectors are all here since the last call, in the order they completed
        (what a sink has not been given yet)."""
        source = self.chunks.fresh if self.chunks is not None else self._fresh
        fresh = list(source)
        source.clear()
        return fresh

    async def open(self) -> None:
        info = await self._js.stream_info(self._stream)
        replicas = info.config.num_replicas or 1
        if self._before is None:
            self._before = info.state.last_seq
        start = (
            dict(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self._last + 1)
            if self._last
            else dict(deliver_policy=DeliverPolicy.ALL)
        )
        self._psub = await self._js.pull_subscribe(
            self._subject,
            stream=self._stream,
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT, inactive_threshold=60.0, num_replicas=replicas, **start
            ),
        )

    async def close(self) -> None:
        if self._psub is not None:
            await close_pull(self._psub)
            self._psub = None

    async def reopen(self, why: str) -> None:
        """Open the consumer again after the last result read; while the server cannot (a lost quorum),
        every poll tries again, half a second apart."""
        if self._psub is not None:
            log.info("results consumer lost (%s): opening it again after result %d", why, self._last)
            await self.close()
        await asyncio.sleep(0.5)
        try:
            await self.open()
        except Exception as again:
            log.debug("results consumer not open yet: %r", again)
        else:
            log.info("results consumer open again after result %d", self._last)

    async def _still_there(self) -> bool:
        if self._psub is None:  # closed meanwhile: gone as well
            return False
        try:
            await self._psub.consumer_info()
            return True
        except Exception as exc:
            log.debug("results consumer: %r", exc)
            return False

    async def poll(self) -> Polled:
        """Results that arrived: their new documents, and of those the ones stored during this run."""
        from nats.errors import TimeoutError as NatsTimeoutError

        if self._psub is None:
            await self.reopen("")
            return Polled()
        try:
            msgs = await self._psub.fetch(64, timeout=self._fetch_wait)
        except (TimeoutError, NatsTimeoutError):
            self._quiet += 1
            if self._quiet >= self._quiet_check:
                self._quiet = 0
                if not await self._still_there():
                    await self.reopen("no answer")
            return Polled()
        except Exception as exc:  # the consumer is gone (server restarted) or the server is away
            await self.reopen(repr(exc))
            return Polled()
        self._quiet = 0
        polled = Polled()
        for msg in msgs:
            seq = 0
            try:
                seq = msg.metadata.sequence.stream
                self._last = max(self._last, seq)
            except Exception:
                pass
            try:
                result = decode_as(msg.data, JobResult)
            except ProtocolError:
                await msg.term()
                continue
            if result.id != self._job or (self._layout is not None and not self._layout.holds(result)):
                log.error(
                    "job %s: a result of job %r, batch %d, row %d, is not one of its own: dropped",
                    self._job,
                    result.id[:100],
                    result.batch,
                    result.start,
                )
                await msg.term()
                continue
            if (result.chunks is None) != (self.chunks is None):
                log.error(
                    "job %s batch %d: rows %s chunks in a job %s: dropped",
                    result.id,
                    result.batch,
                    "without" if result.chunks is None else "with",
                    "of chunks" if self.chunks else "without",
                )
                await msg.term()
                continue
            if result.dtype != self.form.wire or (self.dim and result.dim != self.dim):
                log.error(
                    "job %s batch %d: %s rows of dimension %d in a job of %s rows%s: dropped",
                    result.id,
                    result.batch,
                    WIRE_FORMS[result.dtype].name,
                    result.dim,
                    self.form.name,
                    f" of dimension {self.dim}" if self.dim else "",
                )
                await msg.term()
                continue
            self.dim = result.dim
            new = chunks = 0
            rows = result.ragged() if result.offsets is not None else result.array()
            if self.chunks is not None:
                assert result.chunks is not None  # checked above: a chunk row, as the job's are
                new, chunks = self.chunks.add(result.batch, result.doc_ids, rows, result.chunks)
            else:
                for doc_id, row in zip(result.doc_ids, rows):
                    if doc_id not in self.got:
                        self.got[doc_id] = row
                        self._fresh.append(doc_id)
                        new += 1
            polled = polled.plus(new, result.tokens if new or chunks else 0, seq <= (self._before or 0), chunks)
            try:
                await msg.ack()
            except Exception:
                pass
        return polled
