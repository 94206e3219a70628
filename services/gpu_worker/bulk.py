"""Bulk jobs in the worker: token batches from the JetStream work queue, taken only when no online
work waits, answered into the results stream; acknowledged only once the result is stored.

Held batches get in-progress beats until acknowledged. A batch that cannot be decoded or checked is
given up at once; an engine failure is tried again (nak with a delay) until the last delivery, where
the batch is given up; the server's max-deliveries advisory covers batches whose holders died. All
three become dead letters (shared/jobs/work_queue.py).

A stored result is counted in the job's state before its batch is acknowledged, by its rows, so a
worker that dies in between leaves a batch that is delivered again, stored again as a duplicate (the
message id), and counted then, once. A batch of a cancelled job is acknowledged and dropped unrun;
one that was running when the cancel came is stored, found late by the count (the cancel froze the
job's counts) and its result removed again, so the results stream holds what the state counts.
Told to stop, the feeder fetches no more and hands back the batches queued here that the engine has
not started; those it started are finished, stored and acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable

from nats.aio.client import Client
from nats.js.errors import NotFoundError

from embedfleet.services.gpu_worker.scheduler import Scheduler, Work
from embedfleet.services.gpu_worker.spans import record_work
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.jobs.bucket import has_state_key, update_state
from embedfleet.shared.jobs.progress import Rows
from embedfleet.shared.jobs.publish import publish_durably
from embedfleet.shared.jobs.settings import JobSettings
from embedfleet.shared.jobs.status import count_done, late_rows
from embedfleet.shared.jobs.streams import stream_names
from embedfleet.shared.jobs.work_queue import (
    BatchInfo,
    Cancellations,
    Heartbeats,
    deliveries,
    hand_back,
    join_work,
    undecodable,
)
from embedfleet.shared.nats.subjects import Subjects, model_token
from embedfleet.shared.observability.tracing import Tracer, from_headers, headers_for
from embedfleet.shared.protocol import JobResult, ProtocolError, TokenChunk, decode_as, encode

log = logging.getLogger("embedfleet.worker.bulk")

# Test hook, read only here and set only by the integration tests: "1" makes the worker exit at once
# after it stored a bulk result and before it counted it, as a worker killed at that point would.
CRASH_AFTER_STORE = "EMBEDFLEET_TEST_CRASH_AFTER_STORE"


def describe(data: bytes, headers: dict) -> BatchInfo:
    try:
        batch = decode_as(data, TokenChunk)
        if batch.job is not None:
            return BatchInfo(batch.job, batch.batch, batch.start, len(batch.doc_ids or ()), batch.total, batch.chunks)
    except ProtocolError:
        pass
    return undecodable(data, headers, 2)  # the message id may still name the job


class BulkFeeder:
    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        model: str,
        scheduler: Scheduler,
        check: Callable[[TokenChunk], None],
        wake: Callable[[], None],
        settings: JobSettings,
        tracer: Tracer,
    ) -> None:
        self._nc = nc
        self._tracer = tracer
        self._subjects = subjects
        self._model = model
        self._scheduler = scheduler
        self._check = check
        self._wake = wake
        self._settings = settings
        self._beats = Heartbeats(settings.heartbeat)
        self._task: asyncio.Task | None = None
        self._answers: set[asyncio.Task] = set()
        self._room = asyncio.Event()
        self._stopping = False
        self._crash_after_store = os.environ.get(CRASH_AFTER_STORE) == "1"

    async def start(self) -> None:
        self._js, self._kv, self._work, self._dead = await join_work(
            self._nc,
            self._subjects,
            "bulk",
            f"workers-{model_token(self._model)}",
            self._subjects.bulk(self._model),
            self._settings,
            "worker",
            describe,
        )
        self._cancellations = Cancellations(self._kv)
        self._task = asyncio.create_task(self._loop(), name="bulk-feeder")

    async def stop(self) -> None:
        """Take no more bulk work, and hand back at once the batches the engine has not started (what
        it started finishes, and is stored and acknowledged before ``close``)."""
        self._stopping = True
        if self._task is not None:
            self._work.stop_fetching()  # an idle stage's fetch waits seconds for a batch
            await self._task
            self._task = None
        withdrawn = self._scheduler.withdraw_bulk()
        for work in withdrawn:
            self._beats.release(work.source)
            await hand_back(work.source)
        if withdrawn:
            log.info("stopping: %d bulk batches handed back", len(withdrawn))

    def room(self) -> None:
        """The scheduler's queues emptied: fetch the next bulk batch now."""
        self._room.set()

    async def close(self) -> None:
        """After the worker finished its work: the last results stored, anything delivered since the
        last fetch handed back, no more beats."""
        while self._answers:
            await asyncio.gather(*list(self._answers), return_exceptions=True)
        if await self._work.hand_back_pending():
            log.info("stopping: a bulk batch delivered after the last fetch handed back")
        await self._work.close()
        await self._dead.stop()
        await self._beats.stop()

    async def _loop(self) -> None:
        while not self._stopping:
            # online work first: bulk is fetched only while nothing else waits
            if self._scheduler.online_waiting or self._scheduler.bulk_waiting:
                self._room.clear()
                try:  # woken when the engine takes the queued work (the timeout is a safety net)
                    await asyncio.wait_for(self._room.wait(), 0.05)
                except TimeoutError:
                    pass
                continue
            for msg in await self._work.fetch():
                try:
                    batch = decode_as(msg.data, TokenChunk)
                    if batch.job is None:
                        raise ProtocolError("a bulk batch must name its job")
                    if await self._cancellations.cancelled(batch.job):
                        await msg.ack()  # dropped unrun: its job is cancelled
                        continue
                    self._check(batch)
                except (ProtocolError, ServiceError) as exc:
                    await self._dead.give_up(msg, str(exc), describe(msg.data, msg.headers or {}))
                    continue
                self._beats.hold(msg)
                work = Work(batch, reply="", arrived=time.perf_counter(), source=msg, trace=from_headers(msg.headers))
                self._scheduler.push(work, bulk=True)
                self._wake()

    def answer_soon(self, work: Work, vectors, dtype: str, dim: int, offsets=None, indices=None) -> None:
        """Store a result in the background: the engine goes on with the next batch meanwhile."""
        task = asyncio.create_task(self.answer(work, vectors, dtype, dim, offsets, indices), name="bulk-answer")
        self._answers.add(task)
        task.add_done_callback(self._answered)

    def _answered(self, task: asyncio.Task) -> None:
        self._answers.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("storing a bulk result failed: %r", task.exception())

    async def answer(self, work: Work, vectors, dtype: str, dim: int, offsets=None, indices=None) -> None:
        """Store the result durably, count its rows in the job's state, then acknowledge the batch. A
        crash before the acknowledgement redelivers it: the result's message id makes the second copy
        a no-op, and rows counted before are not counted again."""
        batch, msg = work.batch, work.source
        # bulk work: a job batch's, with its message
        assert msg is not None and batch.job is not None and batch.doc_ids is not None
        result = JobResult(
            id=batch.job,
            batch=batch.batch,
            start=batch.start,
            doc_ids=batch.doc_ids,
            dim=dim,
            dtype=dtype,
            data=vectors.tobytes(),
            tokens=batch.num_tokens,
            offsets=offsets,
            indices=indices,
            chunks=batch.chunks,  # a chunked job's rows are chunks: which, the tokenizer said
        )
        rows = Rows(batch.batch, batch.start, len(batch.doc_ids), batch.total)
        trace = record_work(self._tracer, work, "worker job batch")  # the stored result's reader continues it
        try:
            stored = await publish_durably(
                self._js,
                self._subjects.results(batch.job),
                encode(result),
                f"{batch.job}:{batch.batch}:{batch.start}",
                headers=headers_for(trace),
                patience=self._settings.ack_wait,
            )
            if self._crash_after_store:
                os._exit(70)
            if has_state_key(batch.job):  # a forged job id names no state: the stored result is all there is
                state = await update_state(
                    self._kv,
                    batch.job,
                    lambda s: count_done(s, rows, batch.num_tokens, batch.chunks),
                    patience=self._settings.ack_wait,
                )
                if late_rows(
                    state, rows, batch.chunks is not None
                ):  # computed as the job was cancelled: its counts are final, so is its output
                    with contextlib.suppress(NotFoundError):  # removed already, before a crash
                        await self._js.delete_msg(stream_names(self._subjects)["results"], stored.seq)
            await msg.ack()
        except Exception as exc:  # the server is away for long: the batch is delivered again later
            log.warning("bulk batch %s:%s left for another try: %r", batch.job, batch.batch, exc)
            try:  # in a second, not after --ack-wait, where the server takes the hand-back (its result
                await msg.nak(delay=1.0)  # may be stored already: then only its count is made again)
            except Exception:
                pass
        finally:
            self._beats.release(msg)

    async def failed(self, work: Work, reason: str) -> None:
        """The engine failed on this batch: another try later, or given up on its last delivery."""
        msg = work.source
        assert msg is not None  # bulk work: its message
        if not self._beats.release(msg):
            return  # another part of the same batch failed first: already handled
        record_work(self._tracer, work, "worker job batch", ServiceError(ErrorCode.INTERNAL, reason))
        try:
            if deliveries(msg) >= self._settings.max_deliver:
                await self._dead.give_up(msg, f"engine error: {reason}", describe(msg.data, msg.headers or {}))
            else:
                await msg.nak(delay=1.0)
        except Exception as exc:
            log.warning("bulk batch failure not reported: %r", exc)
