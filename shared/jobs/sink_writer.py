"""A job's rows written into a sink as they are collected: by ``embedfleet reindex --sink`` and by the
gateway for ``POST /v1/jobs`` with ``"sink"`` (services/gateway/jobs/sinks.py); never by a worker.

The collector (shared/jobs/collector.py) hands over each document once all its vectors are read (a
chunked job's: once all its chunks are, so a document given up is never in the store in part); rows
are grouped into upserts of up to ``BATCH_ROWS`` rows or ``BATCH_SECONDS`` of waiting, keyed by id
(and chunk). Nothing is acknowledged to anyone by a write: the job's results stay in the results
stream, and a writer started again after a crash reads them all again from the start and upserts
them again (a repeat writes nothing twice), so rows read but not yet written are never lost.

A store that refuses a batch with a retryable error (down, busy) is waited for: the same batch is
tried again after a backoff (``BACKOFF_FIRST`` s doubling to ``BACKOFF_MOST`` s, with jitter), the
job's state records ``sink_error`` (the store's message and since when) until a write goes through.
A refusal that waiting cannot cure (another dimension) raises. The job is done only once the last
batch is in the store and its index built (``sink_done``, shared/jobs/status.py's ``settle``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from embedfleet.shared.jobs.bucket import update_state
from embedfleet.shared.jobs.status import sink_finished, sink_waiting, sink_written
from embedfleet.shared.nats.retry import Backoff
from embedfleet.shared.sinks.base import Rows, Shape, Sink, SinkError

log = logging.getLogger("embedfleet.sinks")

BATCH_ROWS = 2000  # rows an upsert holds at most
BATCH_SECONDS = 1.0  # the longest a row read waits for its upsert
BACKOFF_FIRST, BACKOFF_MOST = 0.5, 30.0  # seconds between tries of a refused batch


def shape_for(served, form: str, output: str, chunked: bool) -> Shape:
    """The rows a job makes, from the served model's metadata (shared/jobs/fit.py's Served): the
    dimension a table must have is known before anything is published."""
    if output == "sparse":
        dim = served.number("vocab_size")
    elif output == "multivector":
        dim = served.number("multivector_dim", "dim")
    else:
        dim = served.number("dim")
    return Shape(form, output, dim, chunked)


@dataclass(frozen=True)
class Sources:
    """What a row holds besides its vector: each document's other input fields (None: the input has
    none) and its text (None: texts are not stored; a chunked job's texts come with its chunks)."""

    fields: dict[str, dict] | None
    texts: dict[str, str] | None


class SinkWriter:
    """Rows of completed documents, grouped and upserted into ``sink`` with retries.
    ``said(text)``: where the progress line goes (the bar's postfix, or a printed line); ``tell(line)``:
    where a wait for the store and its end are told (printed by reindex, logged by the gateway)."""

    def __init__(
        self,
        sink: Sink,
        kv,
        job: str,
        sources: Sources,
        keep_vectors: bool,
        said: Callable[[str | None], None],
        tell: Callable[[str], None] = log.warning,
    ) -> None:
        self.sink, self._kv, self._job, self._sources = sink, kv, job, sources
        self._keep = keep_vectors  # False: a vector written is dropped from the collector (no file wants it)
        self._said, self._tell = said, tell
        self._pending: list[str] = []  # documents read, not yet written
        self._pending_rows = 0
        self._oldest = 0.0  # monotonic time the oldest pending document was handed over
        self.rows = 0  # rows durably written by this run
        self.waited = 0.0  # seconds this run waited for the store

    def add(self, doc_ids: list[str], collector) -> None:
        if doc_ids and not self._pending:
            self._oldest = time.monotonic()
        self._pending += doc_ids
        chunks = collector.chunks
        self._pending_rows += sum(len(chunks.rows_of(d)) for d in doc_ids) if chunks is not None else len(doc_ids)

    async def flush(self, collector, final: bool = False) -> int:
        """Write what is pending when there is enough of it, or it waited long enough, or ``final``;
        returns the rows written (once the store took them)."""
        if not self._pending or not (
            final or self._pending_rows >= BATCH_ROWS or time.monotonic() - self._oldest >= BATCH_SECONDS
        ):
            return 0
        written = 0
        while self._pending:
            take: list[str] = []
            count = 0
            while self._pending and (count < BATCH_ROWS or not take):
                doc_id = self._pending.pop(0)
                take.append(doc_id)
                count += len(collector.chunks.rows_of(doc_id)) if collector.chunks is not None else 1
            rows = self._rows(take, collector)
            await self._retried(partial(self.sink.write, rows), f"{len(rows.ids)} rows")
            written += len(rows.ids)
            self._pending_rows -= count
            if not self._keep and collector.chunks is None:
                for doc_id in take:
                    collector.got[doc_id] = None  # in the store: the collector only counts it now
        self.rows += written
        await update_state(self._kv, self._job, lambda s: sink_written(s, self.rows))
        return written

    async def finish(self) -> None:
        """After the last batch: the store's index built (retried like a write), and the job's state
        says so (the job is done now, if all its documents are)."""
        await self._retried(self.sink.finish, "the index")
        await update_state(self._kv, self._job, sink_finished)

    def _rows(self, doc_ids: list[str], collector) -> Rows:
        fields, texts = self._sources.fields, self._sources.texts
        if collector.chunks is None:
            vectors: Any = [collector.got[d] for d in doc_ids]
            if vectors and isinstance(vectors[0], np.ndarray) and vectors[0].ndim == 1:
                vectors = np.stack(vectors)  # dense: [n, width]
            return Rows(
                doc_ids,
                vectors,
                None if fields is None else [fields.get(d) for d in doc_ids],
                texts=None if texts is None else [texts[d] for d in doc_ids],
            )
        ids, vectors, places, chunk_texts = [], [], [], []
        for doc_id in doc_ids:
            for k, vector, start, end, text in collector.chunks.rows_of(doc_id):
                ids.append(doc_id)
                vectors.append(vector)
                places.append((k, start, end))
                chunk_texts.append(text)
        with_text = any(t is not None for t in chunk_texts)
        return Rows(
            ids,
            np.stack(vectors),
            None if fields is None else [fields.get(d) for d in ids],
            places,
            chunk_texts if with_text else None,
        )

    async def _retried(self, call: Callable[[], None], what: str) -> None:
        """``call`` in a thread until the store takes it; a retryable refusal waits and tries again."""
        backoff, since = Backoff(BACKOFF_FIRST, BACKOFF_MOST), None
        while True:
            try:
                await asyncio.to_thread(call)
            except SinkError as exc:
                if not exc.retryable:
                    raise
                if since is None:
                    since = time.time()
                    self._tell(
                        f"job {self._job}: waiting for the store {self.sink.shown}, which refused {what}: {exc.message}"
                    )
                    await update_state(self._kv, self._job, partial(sink_waiting, message=exc.message, since=since))
                pause = backoff.next()
                self._said(
                    f"waiting for the store since {time.strftime('%H:%M:%S', time.localtime(since))}, "
                    f"next try in {pause:.1f}s"
                )
                await asyncio.sleep(pause)
                continue
            if since is not None:
                self.waited += time.time() - since
                self._said(None)
                self._tell(
                    f"job {self._job}: the store {self.sink.shown} takes rows again after {time.time() - since:.0f}s"
                )
            return
