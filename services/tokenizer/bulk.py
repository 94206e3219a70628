"""Bulk jobs in the tokenizer: job batches from JetStream -> token batches into the bulk work queue.

A job batch is acknowledged only after every token batch made from it was accepted by the bulk
stream (JetStream's publish acknowledgement), and each token batch carries a message id built from
(job, batch, first row), so a redelivered job batch produces no duplicate work. A malformed batch is
terminated (never retried) and recorded in the job's state.
"""

from __future__ import annotations

import asyncio
import logging
import time

from nats.aio.client import Client

from shared.errors import ServiceError
from shared.jobs import close_pull, ensure_streams, fetch_one, record_error, stream_names, update_state, work_consumer
from shared.protocol import JobBatch, ProtocolError, TokenBatch, decode, decode_as, encode
from shared.subjects import model_token
from services.tokenizer.config import TokenizerConfig
from services.tokenizer.encoder import TextEncoder, pack_chunks

log = logging.getLogger("embedfleet.tokenizer.bulk")

BULK_DEADLINE = 7 * 24 * 3600.0  # bulk work has no client waiting: it may wait behind online work


class BulkTokenizer:
    def __init__(self, nc: Client, cfg: TokenizerConfig, encoder: TextEncoder) -> None:
        self._nc = nc
        self._cfg = cfg
        self._encoder = encoder
        self._subjects = cfg.nats.subjects
        self._task: asyncio.Task | None = None
        self._stopping = False

    async def start(self) -> None:
        js = self._nc.jetstream()
        self._js = js
        self._kv = await ensure_streams(js, self._subjects)
        model = self._cfg.model.id
        subject = self._subjects.jobs(model)
        self._psub = await js.pull_subscribe(
            subject, durable=f"tokenizers-{model_token(model)}", stream=stream_names(self._subjects)["jobs"],
            config=work_consumer(f"tokenizers-{model_token(model)}", subject),
        )
        self._task = asyncio.create_task(self._loop(), name="bulk-tokenizer")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            await self._task  # the batch in hand is finished and acknowledged
            self._task = None
        await close_pull(self._psub)

    async def _loop(self) -> None:
        while not self._stopping:
            for msg in await fetch_one(self._psub):
                await self._handle(msg)

    async def _handle(self, msg) -> None:
        try:
            job = decode_as(msg.data, JobBatch)
            texts = self._encoder.with_prompt(job.texts, job.options)
            ids = await asyncio.to_thread(self._encoder.encode, texts, True, job.options.truncation_direction)
        except (ProtocolError, ServiceError) as exc:
            await self._poisoned(msg, str(exc))
            return
        for chunk in pack_chunks(ids, self._cfg.chunk_tokens, self._cfg.chunk_seqs):
            rows = len(chunk.cu_seqlens) - 1
            batch = TokenBatch(
                id=f"{job.id}.{job.batch}",
                model=job.model,
                start=chunk.start,
                total=len(job.texts),
                input_ids=chunk.input_ids,
                cu_seqlens=chunk.cu_seqlens,
                deadline=time.time() + BULK_DEADLINE,
                options=job.options,
                job=job.id,
                batch=job.batch,
                doc_ids=job.doc_ids[chunk.start : chunk.start + rows],
            )
            await self._js.publish(
                self._subjects.bulk(job.model), encode(batch), headers={"Nats-Msg-Id": f"{job.id}:{job.batch}:{chunk.start}"}
            )
        await msg.ack()

    async def _poisoned(self, msg, reason: str) -> None:
        """A batch that can never succeed: stop its redelivery and say so in the job's state."""
        job_id = "unknown"
        try:
            job_id = decode(msg.data).id
        except Exception:
            pass
        log.warning("job %s: batch given up: %s", job_id, reason)
        await msg.term()
        if job_id != "unknown":
            await update_state(self._kv, job_id, lambda s: record_error(s, f"tokenizer: {reason}"))
