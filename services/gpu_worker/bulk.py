"""Bulk jobs in the worker: token batches from the JetStream work queue, taken only when no online
work waits, answered into the results stream; acknowledged only once the result is stored."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

from nats.aio.client import Client

from shared.errors import ServiceError
from shared.jobs import close_pull, ensure_streams, fetch_one, record_error, stream_names, update_state, work_consumer
from shared.protocol import JobResult, ProtocolError, TokenBatch, decode_as, encode
from shared.subjects import Subjects, model_token
from services.gpu_worker.scheduler import Scheduler, Work

log = logging.getLogger("embedfleet.worker.bulk")


class BulkFeeder:
    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        model: str,
        scheduler: Scheduler,
        check: Callable[[TokenBatch], None],
        wake: Callable[[], None],
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self._model = model
        self._scheduler = scheduler
        self._check = check
        self._wake = wake
        self._task: asyncio.Task | None = None
        self._stopping = False

    async def start(self) -> None:
        self._js = self._nc.jetstream()
        self._kv = await ensure_streams(self._js, self._subjects)
        subject = self._subjects.bulk(self._model)
        durable = f"workers-{model_token(self._model)}"
        self._psub = await self._js.pull_subscribe(
            subject, durable=durable, stream=stream_names(self._subjects)["bulk"], config=work_consumer(durable, subject)
        )
        self._task = asyncio.create_task(self._loop(), name="bulk-feeder")

    async def stop(self) -> None:
        """Take no more bulk work (what was taken finishes and is acknowledged by the worker)."""
        self._stopping = True
        if self._task is not None:
            await self._task
            self._task = None
        await close_pull(self._psub)

    async def _loop(self) -> None:
        while not self._stopping:
            # online work first: bulk is fetched only while nothing else waits
            if self._scheduler.online_waiting or self._scheduler.bulk_waiting:
                await asyncio.sleep(0.002)
                continue
            for msg in await fetch_one(self._psub):
                try:
                    batch = decode_as(msg.data, TokenBatch)
                    if batch.job is None:
                        raise ProtocolError("a bulk batch must name its job")
                    self._check(batch)
                except (ProtocolError, ServiceError) as exc:
                    await self._poisoned(msg, str(exc))
                    continue
                self._scheduler.push(Work(batch, reply="", source=msg), bulk=True)
                self._wake()

    async def answer(self, work: Work, vectors, dtype: str) -> None:
        """Store the result durably, then acknowledge the batch (a crash in between redelivers it;
        the result's message id makes the second copy a no-op)."""
        batch = work.batch
        result = JobResult(
            id=batch.job, batch=batch.batch, start=batch.start, doc_ids=batch.doc_ids, dim=vectors.shape[1],
            dtype=dtype, data=vectors.tobytes(), tokens=batch.num_tokens,
        )
        ack = await self._js.publish(
            self._subjects.results(batch.job), encode(result),
            headers={"Nats-Msg-Id": f"{batch.job}:{batch.batch}:{batch.start}"},
        )
        await work.source.ack()
        if not ack.duplicate:  # a redelivered batch was already counted
            await update_state(self._kv, batch.job, lambda s: _count_done(s, len(batch.doc_ids), batch.num_tokens))

    async def _poisoned(self, msg, reason: str) -> None:
        log.warning("bulk batch given up: %s", reason)
        await msg.term()
        try:
            job = decode_as(msg.data, TokenBatch).job
        except ProtocolError:
            return
        if job:
            await update_state(self._kv, job, lambda s: record_error(s, f"worker: {reason}"))


def _count_done(state: dict, documents: int, tokens: int) -> None:
    state["done"] = state.get("done", 0) + documents
    state["tokens"] = state.get("tokens", 0) + tokens
    if state.get("documents") and state["done"] >= state["documents"] and state.get("status") != "done":
        state["status"] = "done"
        state["finished"] = time.time()
