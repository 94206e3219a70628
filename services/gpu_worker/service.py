"""Worker service: TokenBatch in (queue group), scheduled FCFS, EmbedResult straight to the gateway."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from nats.aio.client import Client
from nats.aio.msg import Msg

from shared.errors import ErrorCode, ServiceError
from shared.lifecycle import register
from shared.protocol import VECTOR_DTYPES, EmbedResult, ErrorReply, ProtocolError, TokenBatch, decode_as, encode
from shared.subjects import WORKER_QUEUE
from services.gpu_worker.config import WorkerConfig
from services.gpu_worker.engine import Engine
from services.gpu_worker.engine.pooling import postprocess
from services.gpu_worker.scheduler import Scheduler, Work

log = logging.getLogger("embedfleet.worker")

# room left in a NATS message for the msgpack envelope around a result payload
_ENVELOPE_BYTES = 1024


class WorkerService:
    def __init__(self, nc: Client, cfg: WorkerConfig, engine: Engine) -> None:
        self._nc = nc
        self._cfg = cfg
        self._engine = engine
        self._scheduler = Scheduler(cfg.max_batch_tokens, cfg.max_batch_seqs)
        self._wake = asyncio.Event()
        self._stopping = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._loop_task: asyncio.Task | None = None
        self._sub = None
        self._micro = None

    async def start(self) -> None:
        model = self._cfg.model
        subject = self._cfg.nats.subjects.tokens(model.id)
        self._loop_task = asyncio.create_task(self._run(), name="engine-loop")
        self._sub = await self._nc.subscribe(subject, queue=WORKER_QUEUE, cb=self._on_batch)
        self._micro = await register(
            self._nc,
            self._cfg.nats.subjects,
            "worker",
            "token IDs -> vectors",
            {"model": model.id, "dim": str(self._engine.dim), "device": str(self._engine.device)},
        )
        log.info("serving %s on %s (budget %d tokens)", model.id, subject, self._cfg.max_batch_tokens)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.drain()
            self._sub = None
        self._stopping = True
        self._wake.set()
        if self._loop_task is not None:
            await self._loop_task  # finishes everything queued
            self._loop_task = None
        if self._micro is not None:
            await self._micro.stop()
            self._micro = None
        self._executor.shutdown(wait=True)

    async def _on_batch(self, msg: Msg) -> None:
        if not msg.reply:
            log.warning("token batch without a reply subject dropped")
            return
        request_id = ""
        try:
            batch = decode_as(msg.data, TokenBatch)
            request_id = batch.id
            if batch.options.dimensions is not None and batch.options.dimensions > self._engine.dim:
                raise ServiceError(
                    ErrorCode.INVALID_REQUEST,
                    f"dimensions {batch.options.dimensions} exceeds the model's {self._engine.dim}",
                )
            self._engine.check(batch.input_ids, batch.cu_seqlens)
        except ProtocolError as exc:
            await self._reply_error(msg.reply, request_id, ServiceError(ErrorCode.INVALID_TOKENS, str(exc)))
            return
        except ServiceError as exc:
            await self._reply_error(msg.reply, request_id, exc)
            return
        self._scheduler.push(Work(batch, msg.reply))
        self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            for work in self._scheduler.drop_expired(time.time()):
                await self._reply_error(work.reply, work.batch.id, ServiceError(ErrorCode.TIMEOUT, "deadline passed in the worker queue"))
            batch = self._scheduler.next_batch()
            if batch is None:
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            t0 = time.perf_counter()
            try:
                vectors = await loop.run_in_executor(self._executor, self._engine.embed, batch.input_ids, batch.cu_seqlens)
            except Exception:
                log.exception("engine failed on a batch of %d tokens", batch.num_tokens)
                for s in batch.slices:
                    await self._reply_error(s.work.reply, s.work.batch.id, ServiceError(ErrorCode.INTERNAL, "engine error"))
                continue
            log.debug("batch: %d seqs, %d tokens, %.1f ms", len(batch.cu_seqlens) - 1, batch.num_tokens, (time.perf_counter() - t0) * 1e3)
            for work in self._scheduler.complete(batch, vectors):
                await self._reply(work)

    async def _reply(self, work: Work) -> None:
        batch, opts = work.batch, work.batch.options
        normalize = self._cfg.model.normalize if opts.normalize is None else opts.normalize
        out = postprocess(work.vectors, normalize, opts.dimensions, VECTOR_DTYPES[opts.dtype])
        row_bytes = out.shape[1] * out.itemsize
        rows_per_msg = max(1, (self._nc.max_payload - _ENVELOPE_BYTES) // row_bytes)
        tokens = batch.num_tokens  # all counted on the first part, so the parts add up
        for r0 in range(0, len(out), rows_per_msg):
            part = out[r0 : r0 + rows_per_msg]
            result = EmbedResult(
                id=batch.id,
                start=batch.start + r0,
                total=batch.total,
                dim=out.shape[1],
                dtype=opts.dtype,
                data=part.tobytes(),
                tokens=tokens,
            )
            tokens = 0
            await self._nc.publish(work.reply, encode(result))

    async def _reply_error(self, reply: str, request_id: str, error: ServiceError) -> None:
        log.info("request %s: %s: %s", request_id or "?", error.code.value, error.message)
        await self._nc.publish(reply, encode(ErrorReply(request_id, error.code, error.message)))
