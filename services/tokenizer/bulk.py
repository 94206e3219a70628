"""Bulk jobs in the tokenizer: job batches from JetStream -> token batches into the bulk work queue.

A job batch is acknowledged only after every token batch made from it was accepted by the bulk
stream (JetStream's publish acknowledgement), and each token batch carries a message id built from
(job, batch, first row), so a redelivered job batch produces no duplicate work. While a batch is in
hand the tokenizer sends in-progress beats. It takes a job batch only while fewer than
``--bulk-ahead`` token batches of its model wait for the workers, so a million-document job waits in
the jobs stream rather than piling up as tokens. A malformed batch is given up at once as a dead
letter (see shared/jobs/work_queue.py); a batch of a cancelled job is acknowledged and dropped untokenized.
Before anything else, a batch must be signed with its job's secret (shared/jobs/claims.py): a forged
one, or one naming no submitted job, is a dead letter counted in no job's state.
A chunked job's batch is cut (services/tokenizer/bulk_chunks.py): its rows are chunks, packed so that
each result fits a message (late chunking: its sequences are windows, each with the chunks it owns as
spans, and a token batch's rows are the chunks its windows own); a document cut into more than --max-chunks chunks is given up alone (a
dead letter holding it, counted failed), and the batch's chunks are counted in the job's state.
A batch of images (services/tokenizer/bulk_images.py) becomes token batches of pixels, a page model's
(bulk_pages.py) token batches of page prompts with their patch rows; an image that cannot be prepared
is given up alone the same way.
Told to stop, it fetches no more, finishes the batch in hand (milliseconds of tokenizing) and hands
back anything delivered after its last fetch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from nats.aio.client import Client

from embedfleet.services.tokenizer.bulk_chunks import BatchCutter, CutBatch, over_budget, pack_rows, vector_bytes
from embedfleet.services.tokenizer.bulk_images import ImageRun, PreparedImages, prepare_batch
from embedfleet.services.tokenizer.bulk_pages import PreparedPages, prepare_pages
from embedfleet.services.tokenizer.config import TokenizerConfig
from embedfleet.services.tokenizer.encoder import pack_chunks
from embedfleet.services.tokenizer.images import ImagePreparer
from embedfleet.services.tokenizer.metrics import BulkEncoder
from embedfleet.services.tokenizer.pages import PagePreparer
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.jobs.bucket import read_state, update_state
from embedfleet.shared.jobs.chunk_progress import count_cut
from embedfleet.shared.jobs.claims import ClaimBook
from embedfleet.shared.jobs.progress import Rows
from embedfleet.shared.jobs.publish import publish_durably
from embedfleet.shared.jobs.streams import stream_names
from embedfleet.shared.jobs.work_queue import (
    BatchInfo,
    Cancellations,
    Heartbeats,
    deliveries,
    job_from_msg_id,
    join_work,
    undecodable,
)
from embedfleet.shared.nats.subjects import model_token
from embedfleet.shared.observability.tracing import Tracer, bind, current, from_headers, headers_for
from embedfleet.shared.protocol import EmbedOptions, JobBatch, ProtocolError, Spans, TokenChunk, decode_as, encode

log = logging.getLogger("embedfleet.tokenizer.bulk")

BULK_DEADLINE = 7 * 24 * 3600.0  # bulk work has no client waiting: it may wait behind online work
_HEADER_BYTES = 256  # room for a publish's headers besides the message id
# bytes of a chunked token batch or its result besides its rows: the message's other fields, the job
# id (in the message, its subject and its message id), the model id
_ENVELOPE_BYTES = 2048


def describe(data: bytes, headers: dict) -> BatchInfo:
    try:
        job = decode_as(data, JobBatch)
        return BatchInfo(job.id, job.batch, 0, job.count, job.count)
    except ProtocolError:
        return undecodable(data, headers, 1)


class BulkTokenizer:
    def __init__(
        self,
        nc: Client,
        cfg: TokenizerConfig,
        encoder: BulkEncoder,
        tracer: Tracer,
        images: ImagePreparer | None = None,
        pages: PagePreparer | None = None,
    ) -> None:
        self._nc = nc
        self._tracer = tracer
        self._cfg = cfg
        self._encoder = encoder
        self._images = images  # a two-tower model's image preparer
        self._pages = pages  # a page model's (neither: the model embeds texts only)
        self._subjects = cfg.nats.subjects
        self._cutter = BatchCutter(encoder, cfg.max_chunks, cfg.max_document_chars)
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._beats = Heartbeats(cfg.jobs.heartbeat)

    async def start(self) -> None:
        model = self._cfg.model.id
        self._js, self._kv, self._work, self._dead = await join_work(
            self._nc,
            self._subjects,
            "jobs",
            f"tokenizers-{model_token(model)}",
            self._subjects.jobs(model),
            self._cfg.jobs,
            "tokenizer",
            describe,
        )
        self._bulk_stream, self._bulk_subject = stream_names(self._subjects)["bulk"], self._subjects.bulk(model)
        self._cancellations = Cancellations(self._kv)
        self._claims = ClaimBook(self._js, self._subjects)
        self._task = asyncio.create_task(self._loop(), name="bulk-tokenizer")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._work.stop_fetching()  # an idle stage's fetch waits seconds for a batch
            await self._task  # the batch in hand is finished and acknowledged
            self._task = None
        if await self._work.hand_back_pending():
            log.info("stopping: a job batch delivered after the last fetch handed back")
        await self._work.close()
        await self._dead.stop()
        await self._beats.stop()

    async def _loop(self) -> None:
        while not self._stopping:
            if await self._workers_behind():
                await asyncio.sleep(0.05)
                continue
            for msg in await self._work.fetch():
                self._beats.hold(msg)
                # the job's trace: the publisher's span is this one's parent, the workers' its children
                span = self._tracer.start("tokenizer job batch", from_headers(msg.headers), "consumer")
                bind(span.context, "")
                try:
                    with span:
                        await self._handle(msg)
                except Exception as exc:  # the server went away mid-batch: it comes back later
                    log.warning("job batch left for another try: %r", exc)
                    try:
                        await msg.nak(delay=1.0)
                    except Exception:
                        pass  # unacknowledged, it is delivered again after ack_wait
                finally:
                    self._beats.release(msg)

    async def _workers_behind(self) -> bool:
        """Whether enough token batches of this model already wait in the bulk stream."""
        try:
            info = await self._js.stream_info(self._bulk_stream, subjects_filter=self._bulk_subject)
        except Exception as exc:
            log.debug("bulk stream info: %r", exc)
            return True  # the server is away: nothing could be published anyway
        waiting = (info.state.subjects or {}).get(self._bulk_subject, 0)
        return waiting >= self._cfg.bulk_ahead

    async def _refused(self, msg) -> bool:
        """Whether the batch is refused as not its job's (forged, altered, or naming no submitted job):
        then it is a dead letter counted in no job's state, nothing of it merged."""
        job_id: str | None
        try:
            job_id = decode_as(msg.data, JobBatch).id
        except ProtocolError:
            job_id = job_from_msg_id(msg.headers or {}, 1).job
        problem = await self._claims.check(job_id, msg.data, msg.headers or {}) if job_id else "it names no job"
        if problem is None:
            return False
        self._encoder.refused()
        await self._dead.give_up(msg, f"refused: {problem}", BatchInfo(job_id, counted=False))
        return True

    async def _handle(self, msg) -> None:
        if await self._refused(msg):
            return
        try:
            job = decode_as(msg.data, JobBatch)
            if model_token(job.model) != model_token(self._cfg.model.id):  # its tokens would go to another model
                raise ServiceError(
                    ErrorCode.MODEL_NOT_FOUND,
                    f"this stream subject serves {self._cfg.model.id}, not {job.model[:200]!r}",
                )
            # the task adapter its rows run with, and its prompt (tasks.py): the workers read it from the batches
            job = replace(job, options=self._encoder.resolve(job.options))
            if await self._cancellations.cancelled(job.id):
                await msg.ack()  # dropped untokenized: its job is cancelled
                return
            cut = failed = None
            if job.images is not None:
                prepared = await self._prepare_images(job)
                batches, failed = self._image_batches(job, prepared), prepared.failed
            elif job.chunking is not None:
                started = time.perf_counter()
                cut = await asyncio.to_thread(self._cutter.cut, job)
                self._encoder.counted(cut.sequences, time.perf_counter() - started)
                await self._within_budget(job, cut)
                batches = self._chunk_batches(job, cut)
            else:
                texts = self._encoder.with_prompt(job.texts, job.options)
                ids = await asyncio.to_thread(self._encoder.encode, texts, True, job.options.truncation_direction)
                batches = self._token_batches(job, ids)
        except (ProtocolError, ServiceError) as exc:
            await self._dead.give_up(msg, str(exc), describe(msg.data, msg.headers or {}))
            return
        # a token batch the stream cannot take (huge document ids) would fail on every delivery; one just
        # under the limit would pass the client's check and break the connection with its headers
        room = self._nc.max_payload - _HEADER_BYTES
        too_large = [len(data) for data, msg_id in batches if len(data) + len(msg_id.encode()) > room]
        if too_large:
            await self._dead.give_up(
                msg,
                f"a token batch of {too_large[0]} bytes exceeds the NATS limit of {self._nc.max_payload}",
                describe(msg.data, msg.headers or {}),
            )
            return
        headers = headers_for(current())
        for data, msg_id in batches:
            await publish_durably(
                self._js,
                self._subjects.bulk(job.model),
                data,
                msg_id,
                headers=headers,
                patience=self._cfg.jobs.ack_wait,
            )
        if cut is not None:
            await self._settle_cut(msg, job, cut)
        elif failed:
            await self._give_up_documents(msg, job, failed)
        await msg.ack()

    async def _prepare_images(self, job: JobBatch) -> PreparedImages | PreparedPages:
        """A batch of images prepared (off the event loop): a two-tower model's as pixels, a page model's as
        pages; ServiceError (the whole batch a dead letter) for a batch this model cannot take at all."""
        model, output = self._cfg.model, job.options.output
        prepare: Callable[[JobBatch], PreparedImages | PreparedPages]
        if self._pages is not None and model.pages:
            if not model.serves(output):
                raise ServiceError(
                    ErrorCode.INVALID_REQUEST,
                    f"model {model.id} makes {', '.join(model.outputs)} vectors of images, not {output}",
                )
            prepare = partial(prepare_pages, self._pages, max_bytes=self._room(job))
        elif self._images is not None or self._pages is not None:
            if output != "dense":
                raise ServiceError(ErrorCode.INVALID_REQUEST, f"images make dense vectors only, not {output}")
            if self._images is not None:
                prepare = partial(prepare_batch, self._images)
            else:  # a NaFlex model's: patch rows
                assert self._pages is not None
                prepare = partial(prepare_pages, self._pages, max_bytes=self._room(job))
        else:
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                f"model {model.id} embeds texts only: a job of images needs a two-tower model or a page model",
            )
        started = time.perf_counter()
        prepared: PreparedImages | PreparedPages = await asyncio.to_thread(prepare, job)
        self._encoder.counted(prepared.counted, time.perf_counter() - started)
        return prepared

    def _room(self, job: JobBatch) -> int:
        """The bytes of rows (their tokens or images and document ids) a token batch of ``job`` may carry."""
        return (
            self._nc.max_payload - _HEADER_BYTES - _ENVELOPE_BYTES - 3 * len(job.id.encode()) - len(job.model.encode())
        )

    def _image_batches(self, job: JobBatch, prepared: PreparedImages | PreparedPages) -> list[tuple[bytes, str]]:
        """A batch's prepared images as token batches (of pixels or of pages), each fitting a NATS message."""
        return [
            self._token_batch(
                job,
                run.first,
                job.count,
                run.input_ids,
                run.cu_seqlens,
                job.doc_ids[run.first : run.first + run.count],
                images=run,
            )
            for run in prepared.runs(job.doc_ids, self._room(job), self._cfg.chunk_seqs)
        ]

    def _token_batches(self, job: JobBatch, ids: list[list[int]]) -> list[tuple[bytes, str]]:
        """A job batch's documents as token batches: (payload, message id) each."""
        batches = []
        for chunk in pack_chunks(ids, self._cfg.chunk_tokens, self._cfg.chunk_seqs):
            rows = len(chunk.cu_seqlens) - 1
            batches.append(
                self._token_batch(
                    job,
                    chunk.start,
                    len(job.texts),
                    chunk.input_ids,
                    chunk.cu_seqlens,
                    job.doc_ids[chunk.start : chunk.start + rows],
                )
            )
        return batches

    def _chunk_batches(self, job: JobBatch, cut: CutBatch) -> list[tuple[bytes, str]]:
        """A chunked job batch's rows (a chunk each) as token batches, each small enough that its result
        fits a NATS message with the rows' ids and texts."""
        room = self._room(job)
        size = vector_bytes(job.options, self._cfg.model.dim)
        # late: a window's chunks are the spans the worker pools (output "spans"), a vector a chunk; a
        # window is never cut short (it holds at most the model's room)
        options = job.options if cut.spans is None else replace(job.options, output="spans", truncate=False)
        bounds = cut.row_bounds()
        batches = []
        for lo, hi in pack_rows(cut, self._cfg.chunk_tokens, self._cfg.chunk_seqs, room, size):
            input_ids, cu_seqlens = cut.packed((lo, hi))
            a, b = int(bounds[lo]), int(bounds[hi])  # the rows (chunks) these sequences make
            batches.append(
                self._token_batch(
                    job,
                    a,
                    cut.rows,
                    input_ids,
                    cu_seqlens,
                    cut.doc_ids[a:b],
                    cut.chunks.part(a, b),
                    options,
                    None if cut.spans is None else cut.spans.between(lo, hi),
                )
            )
        return batches

    def _token_batch(
        self,
        job: JobBatch,
        start: int,
        total: int,
        input_ids,
        cu_seqlens,
        doc_ids: list[str],
        chunks=None,
        options: EmbedOptions | None = None,
        spans: Spans | None = None,
        images: ImageRun | None = None,
    ) -> tuple[bytes, str]:
        batch = TokenChunk(
            id=f"{job.id}.{job.batch}",
            model=job.model,
            start=start,
            total=total,
            input_ids=input_ids,
            cu_seqlens=cu_seqlens,
            deadline=time.time() + BULK_DEADLINE,
            options=options or job.options,
            job=job.id,
            batch=job.batch,
            doc_ids=doc_ids,
            # an image's row holds no prompt of the job's (a page's is the page prompt, pooled whole)
            prompt_tokens=0 if images is not None else self._encoder.prompt_tokens(job.options),
            chunks=chunks,
            spans=spans,
            pixels=None if images is None else images.pixels,
            pages=None if images is None else images.pages,
            page_grids=None if images is None else images.page_grids,
        )
        return encode(batch), f"{job.id}:{job.batch}:{start}"

    async def _give_up_documents(self, msg, job: JobBatch, failed: list[tuple[int, str]]) -> None:
        """After a batch's token batches are in the stream: its documents given up alone (a chunked job's
        cut into too many chunks, an image that could not be prepared), a dead letter each, holding the
        document, counted failed once however often the batch comes."""
        for d, why in failed:
            letter = (
                JobBatch(job.id, job.batch, job.model, [job.doc_ids[d]], [job.texts[d]], job.options, job.chunking)
                if job.images is None
                else JobBatch(job.id, job.batch, job.model, [job.doc_ids[d]], [], job.options, images=[job.images[d]])
            )
            headers = {**(msg.headers or {}), "Nats-Msg-Id": f"{job.id}:{job.batch}:{d}"}  # a letter per document
            await self._dead.record(
                encode(letter),
                headers,
                msg.subject,
                why,
                BatchInfo(job.id, job.batch, d, 1, job.count),
                deliveries(msg),
            )

    async def _within_budget(self, job: JobBatch, cut: CutBatch) -> None:
        """ServiceError (the batch a dead letter) when its chunks would take the job's results past
        --job-max-result-bytes, the job's chunks cut before it read from its state."""
        if not self._cfg.job_max_result_bytes:
            return
        state = await read_state(self._kv, job.id)
        before = 0
        if state is not None:  # a batch cut before (delivered again) is in the job's chunks already
            before = state.chunks - (0 if state.cut.account(Rows(0, job.batch, 1, state.batches))[1] else cut.rows)
        size = vector_bytes(job.options, self._cfg.model.dim)
        problem = over_budget(cut, size, max(before, 0), self._cfg.job_max_result_bytes)
        if problem is not None:
            raise ServiceError(ErrorCode.INPUT_TOO_LONG, problem)

    async def _settle_cut(self, msg, job: JobBatch, cut: CutBatch) -> None:
        """After a chunked batch's token batches are in the stream: its documents cut into too many
        chunks given up, and its chunks counted in the job's state, each once however often the batch comes."""
        await self._give_up_documents(msg, job, cut.failed)
        rows = cut.rows
        await update_state(self._kv, job.id, lambda s: count_cut(s, job.batch, rows), patience=self._cfg.jobs.ack_wait)
