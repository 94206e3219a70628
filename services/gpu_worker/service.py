"""Worker service: TokenChunk in (queue group), scheduled FCFS, EmbedResult straight to the gateway.

Each engine replica has its own loop: it cuts the next batch, launches it (``step`` returns at
once on CUDA), and only then waits for the previous batch's result, so batch N+1 is assembled and
queued on the device while batch N runs. A result not ready yet (CUDA) is waited for on the replica's
thread, which is idle once its launch returned: the loop is never blocked, and never polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import json
import logging
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.micro.service import Service

from embedfleet.services.gpu_worker.bulk import BulkFeeder
from embedfleet.services.gpu_worker.config import WorkerConfig
from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.engine.errors import EngineError, InputTooLong, InvalidSpans, InvalidTokens
from embedfleet.services.gpu_worker.engine.pooling import postprocess
from embedfleet.services.gpu_worker.engine.results import CudaResult, ReadyResult
from embedfleet.services.gpu_worker.load_reports import ReportCadence
from embedfleet.services.gpu_worker.metrics import WorkerMetrics
from embedfleet.services.gpu_worker.ragged import sparse_rows, split_inputs, token_rows
from embedfleet.services.gpu_worker.replies import Outgoing
from embedfleet.services.gpu_worker.scheduler import Batch, Scheduler, Work
from embedfleet.services.gpu_worker.spans import record_work
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.images.pages import PageProcessing
from embedfleet.shared.nats.bundles import answer, is_bundle, unbundle
from embedfleet.shared.nats.cancel_keys import CancelKeys
from embedfleet.shared.nats.lifecycle import register, start_jetstream_part
from embedfleet.shared.nats.subjects import WORKER_QUEUE
from embedfleet.shared.observability.metrics_server import MetricsServer, serve_metrics
from embedfleet.shared.observability.tracing import TraceContext, Tracer, bind, from_headers
from embedfleet.shared.protocol import (
    DELIVERY_CHECK,
    MAX_STAGES,
    EmbedResult,
    ErrorReply,
    Held,
    JobResult,
    LoadReport,
    ProtocolError,
    TokenChunk,
    decode_as,
    encode,
    row_bytes,
)
from embedfleet.shared.vectors.forms import FORMS, WIRE_FORMS
from embedfleet.shared.vectors.quantize import quantize

FLOAT32 = FORMS["float32"].dtype

log = logging.getLogger("embedfleet.worker")

# room left in a NATS message for the msgpack envelope around a result payload
_ENVELOPE_BYTES = 1024
# an EmbedResult's bytes besides its id, stage names, timings and vectors (keys, counts, dtype: ~70)
_FIXED_ENVELOPE = 256
# a token batch may hold at most this many times the engine's batch of sequences (--max-batch-seqs): a
# tokenizer's batches hold --chunk-seqs rows (256 by default, as --max-batch-seqs is); more is refused
# before it is queued, so that one message cannot hold the engine for hundreds of batches
ROWS_PER_BATCH = 64
# batches of every size leave the C heap fragmented: its free pages go back to the system this often
_TRIM_SECONDS = 2.0


def _load_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to trim
        return None


_MALLOC_TRIM = _load_trim()


def _trim_heap() -> None:
    """Return the C heap's free pages to the system (glibc); without it a worker's memory climbs by
    hundreds of MB under steady traffic of varied batch sizes, though nothing leaks."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


# the engine's errors as wire codes
_CODES: dict[type[EngineError], ErrorCode] = {
    InvalidTokens: ErrorCode.INVALID_TOKENS,
    InputTooLong: ErrorCode.INPUT_TOO_LONG,
    InvalidSpans: ErrorCode.INVALID_REQUEST,
}


def wire_error(error: EngineError, batch: TokenChunk) -> ServiceError:
    """An engine error on a batch row as the wire error of its request's row (the batch holds the
    request's rows from ``batch.start``)."""
    return ServiceError(_CODES[type(error)], error.message, batch.start + error.row)


def _ragged_limits(model) -> dict[str, str]:
    """A sparse vector's most entries (SPLADE weighs the whole vocabulary, BGE-M3 only the input's
    tokens) and a multi-vector's width, as discovery metadata."""
    limits = {}
    if model.sparse is not None:
        whole = model.sparse.kind == "mlm"
        limits["sparse_entries"] = str(model.vocab_size if whole else min(model.vocab_size, model.max_seq_length))
    if model.multivector is not None:
        limits["multivector_dim"] = str(model.multivector.dim)
    if model.pages:
        # a page's tokens: its merged patches at the processor's bound, its prompt's (a token a byte at most)
        # and what a template may add around it
        merged = PageProcessing.from_folder(model.path).max_patches // model.image_merge**2
        limits["page_tokens"] = str(merged + len(model.page_prompt.encode()) + 8)
    return limits


def _envelope_bound(request_id: str, timings: dict[str, float]) -> int:
    """At least the bytes of an EmbedResult without its vectors: a few numbers and short strings
    (_FIXED_ENVELOPE), the id and the stage names (at most 4 bytes a character in UTF-8, 5 of msgpack
    header), a float64 per stage."""
    return _FIXED_ENVELOPE + 4 * len(request_id) + sum(4 * len(stage) + 14 for stage in timings)


def _rows_per_vector(bulk: bool, output: str) -> bool:
    """Whether a result holds a vector per row: dense work, and bulk work with spans, whose spans are a
    late-chunked job's chunks, each a result row of its own (``TokenChunk.chunks``)."""
    return output == "dense" or (bulk and output == "spans")


def _stage_timings(work: Work) -> dict[str, float]:
    """The stages before the worker, as many as leave room for its two (queue, inference) within MAX_STAGES."""
    upstream = dict(list(work.batch.timings.items())[: MAX_STAGES - 2])
    return {**upstream, "queue": (work.started or work.arrived) - work.arrived, "inference": work.inference}


class WorkerService:
    def __init__(
        self, nc: Client, cfg: WorkerConfig, engines: list[Engine], threads: list[ThreadPoolExecutor] | None = None
    ) -> None:
        """``threads``: the replicas' engine threads when the engines were built on them (see
        ``replicas.replica_threads``); otherwise one is started per replica."""
        self._nc = nc
        self._threads = threads or []
        self._cfg = cfg
        self._engines = engines
        first = engines[0]
        self._dim = first.dim
        self._scheduler = Scheduler(
            first.max_batch_tokens, first.max_batch_seqs, cfg.bulk_batch_tokens, adapters=first.adapter_names
        )
        self.metrics = WorkerMetrics(cfg.model.id, self._scheduler, first.max_batch_tokens)
        self._exporter: MetricsServer | None = None
        self._tracer = Tracer("worker", cfg.tracing)
        self._wake = asyncio.Event()  # work was queued: for the replicas' loops
        self._arrived = asyncio.Event()  # the same, for the load reports' loop
        self._stopping = False
        self._tasks: list[asyncio.Task] = []
        self._executors: list[ThreadPoolExecutor] = []
        self._sub: Subscription | None = None
        self._direct_sub: Subscription | None = None
        self._cancel_sub: Subscription | None = None
        self._cancels = CancelKeys()  # requests given up by their requesters (shared/protocol's Cancel)
        self._micro: Service | None = None
        self._id = uuid.uuid4().hex[:16]
        self._running_tokens = 0  # tokens in launched, uncollected batches
        self._rate = 0.0  # tokens/s of recent batches (moving average), for the tokenizers' routing
        self._report_task: asyncio.Task | None = None
        self._bulk: BulkFeeder | None = None

    async def start(self) -> None:
        self._exporter = serve_metrics(self.metrics.registry, self._cfg.metrics)
        model = self._cfg.model
        subjects = self._cfg.nats.subjects
        subject = subjects.tokens(model.id)
        self._direct = subjects.worker(model.id, self._id)
        for i, engine in enumerate(self._engines):
            if i < len(self._threads):
                executor = self._threads[i]
            else:
                executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"replica-{i}")
            self._executors.append(executor)
            self._tasks.append(asyncio.create_task(self._run(engine, executor), name=f"replica-{i}"))
        self._sub = await self._nc.subscribe(subject, queue=WORKER_QUEUE, cb=self._on_batch)
        self._direct_sub = await self._nc.subscribe(self._direct, cb=self._on_batch)  # load-aware routing
        # every worker of the model hears each Cancel: any of them may hold the request's rows
        self._cancel_sub = await self._nc.subscribe(subjects.cancel(model.id), cb=self._on_cancel)
        self._report_task = asyncio.create_task(self._report_load(), name="load-reports")
        try:
            bulk = BulkFeeder(
                self._nc,
                subjects,
                model.id,
                self._scheduler,
                self._check_bulk,
                self._work_queued,
                self._cfg.jobs,
                self._tracer,
            )
            await start_jetstream_part(bulk.start)  # a cluster just started may still elect its leader
            self._bulk = bulk
        except Exception as exc:  # a NATS server without JetStream still serves online requests
            log.warning("bulk jobs disabled: JetStream is not available (%s)", exc)
        first = self._engines[0]
        self._micro = await register(
            self._nc,
            self._cfg.nats.subjects,
            "worker",
            "token IDs -> vectors",
            {
                "model": model.id,
                "instance": self._id,  # the id of its load reports
                "dim": str(self._dim),
                "device": str(first.device),
                "replicas": str(len(self._engines)),
                "dtype": first.dtype_name,
                "pooling": model.pooling,
                "normalize": "true"
                if model.normalize
                else "false",  # a chunked request's mean is normalised as its chunks
                "task": model.task,
                "outputs": ",".join(model.outputs),
                "inputs": ",".join(model.inputs),  # what it embeds: text, and image for a two-tower model
                # the most a document's sparse / multivector output can hold (bulk jobs size batches by it)
                **_ragged_limits(model),
                # a classifier's label names by logit, as JSON (names may hold commas)
                **({"labels": json.dumps(model.labels)} if model.labels else {}),
                "max_batch_tokens": str(first.max_batch_tokens),
            },
        )
        log.info("serving %s on %s (budget %d tokens)", model.id, subject, first.max_batch_tokens)

    async def stop(self) -> None:
        if self._bulk is not None:
            await self._bulk.stop()
        if self._report_task is not None:
            self._report_task.cancel()
            self._report_task = None
            # the last report: the tokenizers stop routing here at once
            await self._publish_load(self.load, self._cfg.load_interval, leaving=True)
        for sub in (self._sub, self._direct_sub, self._cancel_sub):
            if sub is not None:
                await sub.drain()
        self._sub = self._direct_sub = self._cancel_sub = None
        self._stopping = True
        self._wake.set()
        await asyncio.gather(*self._tasks)  # each loop finishes what is queued and in flight
        self._tasks.clear()
        if self._bulk is not None:
            await self._bulk.close()
        if self._micro is not None:
            await self._micro.stop()
            self._micro = None
        for executor in self._executors:
            executor.shutdown(wait=True)
        if self._exporter is not None:
            self._exporter.close()
        self._tracer.shutdown()

    async def _report_load(self) -> None:
        cadence = ReportCadence(self._cfg.load_interval, self._cfg.load_idle_interval)
        while True:
            self._arrived.clear()  # before the load is read: work that comes after it wakes the wait below
            load = self.load
            interval = cadence.due(load, time.monotonic())
            if interval is not None:
                try:
                    await self._publish_load(load, interval)
                except Exception as exc:  # a report lost during a reconnect is replaced by the next one
                    log.debug("load report: %s", exc)
            if load:  # busy: a report a tick, whatever arrives in between
                await asyncio.sleep(cadence.busy)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), cadence.wait(load, time.monotonic()))
            if self._arrived.is_set():
                # work came to an idle worker: reported at the next tick if it is still there, so a query
                # answered within a tick costs no report (nor the tokenizers' reading of two)
                await asyncio.sleep(cadence.busy)

    async def _publish_load(self, load: int, interval: float, leaving: bool = False) -> None:
        report = LoadReport(
            id=self._id,
            model=self._cfg.model.id,
            subject=self._direct,
            queued_tokens=load,
            interval=interval,
            leaving=leaving,
            rate=self._rate,
        )
        payload = encode(report)
        await self._nc.publish(self._cfg.nats.subjects.load(self._cfg.model.id), payload)
        if leaving:  # the fleet watches hear of it on a subject of its own, not in every report
            await self._nc.publish(self._cfg.nats.subjects.leaving(), payload)

    def _work_queued(self) -> None:
        self._wake.set()
        self._arrived.set()

    @property
    def load(self) -> int:
        """Tokens waiting or running on this worker."""
        return self._scheduler.queued_tokens + self._running_tokens

    async def _on_batch(self, msg: Msg) -> None:
        if not msg.data and msg.headers and DELIVERY_CHECK in msg.headers:
            return  # a tokenizer's check that its batches reached a worker: arriving is the answer
        if not msg.reply:
            log.warning("token batch without a reply subject dropped")
            return
        outgoing = Outgoing()  # the answers it gets at once (Held, refusals): one message per requester
        if is_bundle(msg.data):  # a tokenizer's batches for one requester, in one message (shared/nats/bundles.py)
            try:
                entries = unbundle(msg)
            except ProtocolError as exc:
                outgoing.add(False, msg.reply, self._refusal("", ServiceError(ErrorCode.INVALID_TOKENS, str(exc))))
            else:
                self.metrics.bundled(len(entries))
                for entry in entries:
                    self._admit(entry.data, entry.reply, entry.headers, entry.carrier, outgoing)
        else:
            self._admit(msg.data, msg.reply, msg.headers, msg.reply, outgoing)
        bind(None, "")
        await self._publish(outgoing)

    async def _on_cancel(self, msg: Msg) -> None:
        """A requester gave up a request: its queued rows are dropped, and those that come later too."""
        cancel = self._cancels.take(msg.data, time.time())
        if cancel is None:
            return
        dropped = self._scheduler.cancel(cancel.key)
        if dropped:
            rows = sum(work.rows_left for work in dropped)
            self.metrics.dropped("cancelled", rows)
            log.info("request %s: cancelled by its requester: %d queued rows dropped", cancel.id, rows)

    def _admit(self, data: bytes, reply: str, headers: dict[str, str] | None, carrier: str, outgoing: Outgoing) -> None:
        """One token batch queued, or refused; its immediate answers (Held, a refusal) added to ``outgoing``."""
        request_id = ""
        trace = from_headers(headers)
        bind(trace, "")  # the subscription's task runs every message: each binds its own
        try:
            batch = decode_as(data, TokenChunk)
            request_id = batch.id
            bind(trace, request_id)
            if self._cancels.holds(batch.cancel_key, time.time()):  # its Cancel came first: nobody reads it
                self.metrics.dropped("cancelled", batch.count)
                log.info(
                    "request %s: cancelled by its requester: %d rows dropped as they came", request_id, batch.count
                )
                return
            self._check_batch(batch)
            if batch.num_tokens > self._cfg.max_queued_tokens:  # online work: no queue of this worker takes it
                raise ServiceError(
                    ErrorCode.INVALID_REQUEST,
                    f"a token batch of {batch.num_tokens} tokens is over this worker's queue of "
                    f"{self._cfg.max_queued_tokens} (--max-queued-tokens): send smaller batches (--chunk-tokens)",
                )
            if self._scheduler.queued_tokens + batch.num_tokens > self._cfg.max_queued_tokens:
                raise ServiceError(
                    ErrorCode.OVERLOADED,
                    f"the worker has {self._scheduler.queued_tokens} tokens waiting, its limit; retry later",
                )
        except (ProtocolError, ServiceError) as exc:
            error = exc if isinstance(exc, ServiceError) else ServiceError(ErrorCode.INVALID_TOKENS, str(exc))
            outgoing.add(False, reply, self._refusal(request_id, error, trace), carrier)
            return
        if batch.held:  # these rows are ours now: should this process die, the requester sends them again
            outgoing.add(batch.replies, reply, encode(Held(batch.id, batch.start, batch.count, self._id)), carrier)
        self._scheduler.push(Work(batch, reply, arrived=time.perf_counter(), trace=trace, carrier=carrier))
        self._work_queued()

    def _check_batch(self, batch: TokenChunk) -> None:
        model, output = self._cfg.model, batch.options.output
        rows = ROWS_PER_BATCH * self._scheduler.max_seqs
        if batch.count > rows:
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                f"a token batch of {batch.count} rows is over this worker's limit of {rows} "
                f"({ROWS_PER_BATCH} x --max-batch-seqs): send smaller batches (the tokenizer's --chunk-seqs)",
            )
        if not model.serves(output):
            offers = ", ".join(o for o in ("dense", "sparse", "multivector", "tokens", "spans") if model.serves(o))
            raise ServiceError(
                ErrorCode.INVALID_REQUEST, f"model {model.id} does not make {output} vectors (it makes: {offers})"
            )
        task = batch.options.task
        if task is not None and task not in self._engines[0].adapter_names:
            names = self._engines[0].adapter_names
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                f"model {model.id} has no task {task[:100]!r} (its tasks: {', '.join(names) or 'none: no task adapters'})",
            )
        if batch.options.dimensions is not None and batch.options.dimensions > self._dim:
            raise ServiceError(
                ErrorCode.INVALID_REQUEST, f"dimensions {batch.options.dimensions} exceeds the model's {self._dim}"
            )
        try:
            if batch.image_rows and output != "dense":
                raise ServiceError(ErrorCode.INVALID_REQUEST, f"images make dense vectors only, not {output}")
            if batch.pixels is not None:
                self._engines[0].check_images(batch.pixels, batch.cu_seqlens)
            elif batch.image_rows:  # patch rows (SigLIP 2 NaFlex): counted as patches, not bounded as texts
                self._engines[0].check_pages(batch.input_ids, batch.cu_seqlens, batch.pages, batch.page_grids)
            else:
                self._engines[0].check(batch.input_ids, batch.cu_seqlens, batch.token_types, batch.spans)
                self._engines[0].check_pages(batch.input_ids, batch.cu_seqlens, batch.pages, batch.page_grids)
        except EngineError as exc:
            raise wire_error(exc, batch) from None

    def _check_bulk(self, batch: TokenChunk) -> None:
        """A bulk batch's vectors are stored as one message, under a message id naming the job: a batch
        whose vectors cannot fit in one can never succeed."""
        self._check_batch(batch)
        opts = batch.options
        assert batch.job is not None and batch.doc_ids is not None  # a job batch: BulkFeeder took it as one
        if not _rows_per_vector(True, opts.output):
            return  # entries per document are known once made: checked then (_reply_ragged)
        rows = len(batch.doc_ids)  # a vector each: the rows, or with spans the spans (a late job's chunks)
        envelope = len(
            encode(
                JobResult(
                    batch.job, batch.batch, batch.start, batch.doc_ids, 1, opts.dtype, b"", 0, chunks=batch.chunks
                )
            )
        )
        size = rows * row_bytes(opts.dtype, opts.dimensions or self._cfg.model.truncate_dim or self._dim)
        if envelope + size + 2 * len(batch.job.encode()) + _ENVELOPE_BYTES > self._nc.max_payload:
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                f"the vectors of {rows} documents do not fit in one "
                f"message of {self._nc.max_payload} bytes: use smaller batches",
            )

    async def _run(self, engine: Engine, executor: ThreadPoolExecutor) -> None:
        loop = asyncio.get_running_loop()
        in_flight: deque[tuple[Batch, ReadyResult | CudaResult, float, int]] = deque()
        replica = self._engines.index(engine)
        trimmed = time.monotonic()
        while True:
            if time.monotonic() - trimmed > _TRIM_SECONDS:
                await loop.run_in_executor(executor, _trim_heap)
                trimmed = time.monotonic()
            # collect what is already done (on CPU every batch is, once its step returned) before the
            # next launch, so an answer never waits behind a batch launched after it
            while in_flight and in_flight[0][1].ready():
                await self._finish(*in_flight.popleft())
            for work in self._scheduler.drop_expired(time.time()):
                await self._expired(work)
            batch = self._scheduler.next_batch()
            if self._bulk is not None and not (self._scheduler.online_waiting or self._scheduler.bulk_waiting):
                self._bulk.room()  # bulk work may come in while this batch runs
            if batch is None:
                if in_flight:
                    await self._finish(*in_flight.popleft())
                    continue
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            launched = time.perf_counter()
            self._running_tokens += batch.num_tokens
            for s in batch.slices:
                if s.work.started is None:
                    s.work.started = launched
            # a lone small batch (nothing in flight or waiting: a quiet moment) runs on this thread; under load
            # the replica's thread runs every batch, this one decoding and answering meanwhile
            alone = not in_flight and not (self._scheduler.online_waiting or self._scheduler.bulk_waiting)
            images = batch.pixels is not None or batch.pages is not None
            try:
                if alone and engine.runs_inline(batch.num_tokens, batch.outputs, images):
                    # a step of a few hundred microseconds costs less here than the two thread hand-offs (a
                    # futex wake of the replica's thread, the loop's wake by its result) and a colder thread
                    handle = engine.step(*_step_args(batch))
                else:
                    handle = await (
                        loop.run_in_executor(executor, engine.step_images, batch.pixels)
                        if batch.pixels is not None
                        else loop.run_in_executor(executor, engine.step_patches, batch.pages)
                        if batch.pages is not None and batch.patch_images
                        else loop.run_in_executor(executor, engine.step, *_step_args(batch))
                    )
            except Exception:
                log.exception("engine failed on a batch of %d tokens", batch.num_tokens)
                self._running_tokens -= batch.num_tokens
                await self._fail(batch)
                continue
            in_flight.append((batch, handle, launched, replica))
            if len(in_flight) > 1:  # batch N+1 is launched: now collect batch N
                await self._finish(*in_flight.popleft())

    async def _expired(self, work: Work) -> None:
        """``work``'s deadline passed before all its rows ran: the rest never run, and it is answered so."""
        self.metrics.dropped("expired", work.rows_left)
        ran = work.batch.count - work.rows_left
        why = "deadline passed in the worker queue" + (f" ({ran} of {work.batch.count} rows run)" if ran else "")
        if work.source is not None:
            await self._feeder().failed(work, why)  # tried again, then given up as a dead letter
            return
        await self._reply_error(work, ServiceError(ErrorCode.TIMEOUT, why))

    async def _finish(self, batch: Batch, handle, launched: float, replica: int = 0) -> None:
        if not handle.ready():  # CUDA: sleep on the batch's event in the replica's thread
            await asyncio.get_running_loop().run_in_executor(self._executors[replica], handle.wait)
        took = time.perf_counter() - launched
        self.metrics.batch_done(replica, batch, handle.run, launched, took)
        self._running_tokens -= batch.num_tokens
        rate = batch.num_tokens / max(took, 1e-6)
        self._rate = rate if not self._rate else 0.8 * self._rate + 0.2 * rate
        for s in batch.slices:
            s.work.inference += took
        try:
            vectors = handle.result()
        except Exception:
            log.exception("reading a batch result failed")
            await self._fail(batch)
            return
        outgoing = Outgoing()  # the batch's replies: one message per requester where it takes them so
        for work in self._scheduler.complete(batch, vectors):
            bind(work.trace, work.batch.id)  # its log lines carry its ids
            try:
                await self._reply(work, outgoing)
            except Exception:  # one unanswerable request must not stop this replica's loop
                log.exception("answering request %s failed", work.batch.id)
        bind(None, "")
        await self._publish(outgoing)

    async def _publish(self, outgoing: Outgoing) -> None:
        for subject, payload in outgoing.messages(self._nc.max_payload):
            try:
                await self._nc.publish(subject, payload)
            except Exception:  # the connection is going away: the requesters send these rows again
                log.exception("publishing a reply on %s failed", subject)

    def _feeder(self) -> BulkFeeder:
        """The bulk feeder, which all bulk work (work with a ``source``) came through."""
        assert self._bulk is not None
        return self._bulk

    async def _fail(self, batch: Batch) -> None:
        self.metrics.batch_failed(batch)
        for s in batch.slices:
            if s.work.source is not None:
                await self._feeder().failed(s.work, "the engine failed on the batch")  # tried again, then given up
                continue
            await self._reply_error(s.work, ServiceError(ErrorCode.INTERNAL, "engine error"))

    def _pooled(self, work: Work) -> np.ndarray:
        """A finished dense or spans work's vectors as the request asks them: Matryoshka truncation (a
        request that names no dimensions gets the folder's truncate_dim, as encode() does), then the L2
        norm where the model's stack normalises (or the request says), float32."""
        opts = work.batch.options
        normalize = self._cfg.model.normalize if opts.normalize is None else opts.normalize
        assert work.vectors is not None  # finished
        return postprocess(work.vectors, normalize, opts.dimensions or self._cfg.model.truncate_dim, FLOAT32)

    def _ragged(self, work: Work) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
        """A finished sparse / tokens / multivector / spans work as (offsets, payload, indices or None, dim)."""
        batch, opts, model = work.batch, work.batch.options, self._cfg.model
        vectors = work.vectors
        assert vectors is not None  # finished
        if opts.output == "spans":  # a vector per span, made as a dense vector is
            floats = self._pooled(work)
            assert batch.spans is not None  # checked with the batch: output "spans" comes with them
            return batch.spans.offsets.astype(np.int32), quantize(floats, opts.form), None, floats.shape[1]
        if opts.output == "sparse":
            offsets, indices, values = sparse_rows(vectors, opts.sparse_threshold, opts.sparse_top_k)
            return offsets, values.astype(WIRE_FORMS[opts.dtype].dtype), indices, vectors.shape[1]
        drop = None
        skip_first = False
        if opts.output == "multivector":
            spec = model.multivector
            assert spec is not None  # checked with the batch: the model makes multivectors
            skip_first = spec.skip_first
            if spec.skiplist_ids and (opts.input_type or "document") in spec.skiplist_tasks:
                drop = np.asarray(spec.skiplist_ids, dtype=np.int32)
        offsets, rows = token_rows(vectors, batch.input_ids, batch.cu_seqlens, skip_first, drop)
        return offsets, quantize(rows, opts.form), None, rows.shape[1]

    async def _reply(self, work: Work, outgoing: Outgoing) -> None:
        """Answer a finished ``work``: bulk work is stored, online replies are added to ``outgoing``."""
        if not _rows_per_vector(work.source is not None, work.batch.options.output):
            await self._reply_ragged(work, outgoing)
            return
        batch, opts = work.batch, work.batch.options
        floats = self._pooled(work)
        dim = floats.shape[1]
        out = quantize(floats, opts.form)  # the form the request asked for (float32: as is)
        if work.source is not None:
            self._feeder().answer_soon(work, out, opts.dtype, dim)  # stored while the engine runs the next batch
            return
        record_work(self._tracer, work, "worker embed")
        row_bytes = out.shape[1] * out.itemsize
        tokens = batch.num_tokens  # all counted on the first part, so the parts add up
        timings = _stage_timings(work)
        # the envelope holds the request's id and timings, which the request chose: bounded from their
        # lengths, and measured only when the vectors may not fit one message with that bound
        envelope = _envelope_bound(batch.id, timings)
        if envelope + out.nbytes + _ENVELOPE_BYTES > self._nc.max_payload:
            envelope = len(
                encode(EmbedResult(batch.id, batch.start, batch.total, dim, opts.dtype, b"", tokens, timings))
            )
        rows_per_msg = max(1, (self._nc.max_payload - envelope - _ENVELOPE_BYTES) // row_bytes)
        for r0 in range(0, len(out), rows_per_msg):
            part = out[r0 : r0 + rows_per_msg]
            result = EmbedResult(
                id=batch.id,
                start=batch.start + r0,
                total=batch.total,
                dim=dim,
                dtype=opts.dtype,
                data=part.tobytes(),
                tokens=tokens,
                timings=timings,
            )
            tokens = 0
            outgoing.add(batch.replies, work.reply, encode(result), work.carrier)

    async def _reply_ragged(self, work: Work, outgoing: Outgoing) -> None:
        batch, opts = work.batch, work.batch.options
        offsets, payload, indices, dim = self._ragged(work)
        if work.source is not None:
            assert batch.job is not None and batch.doc_ids is not None  # a job batch (_check_bulk)
            size = payload.nbytes + offsets.nbytes + (0 if indices is None else indices.nbytes)
            if (
                size + 2 * len(batch.job.encode()) + sum(len(d) for d in batch.doc_ids) + _ENVELOPE_BYTES
                > self._nc.max_payload
            ):
                await self._feeder().failed(
                    work,
                    f"the {opts.output} vectors of {batch.count} documents take {size} bytes, "
                    f"over one message of {self._nc.max_payload}: use smaller batches",
                )
                return
            self._feeder().answer_soon(work, payload, opts.dtype, dim, offsets, indices)
            return
        record_work(self._tracer, work, "worker embed")
        tokens = batch.num_tokens
        timings = _stage_timings(work)
        empty = EmbedResult(
            batch.id,
            batch.start,
            batch.total,
            dim,
            opts.dtype,
            b"",
            tokens,
            timings,
            offsets=np.zeros(batch.count + 1, np.int32),
            indices=None if indices is None else indices[:0],
        )
        entry = (payload.shape[1] if payload.ndim == 2 else 1) * payload.itemsize + (4 if indices is not None else 0)
        try:
            parts = split_inputs(offsets, entry, self._nc.max_payload - len(encode(empty)) - _ENVELOPE_BYTES)
        except ValueError as exc:
            await self._reply_error(
                work,
                ServiceError(
                    ErrorCode.INVALID_REQUEST, f"{exc} (NATS max_payload): send shorter inputs, or ask a smaller dtype"
                ),
            )
            return
        for lo, hi in parts:
            a, b = int(offsets[lo]), int(offsets[hi])
            result = EmbedResult(
                id=batch.id,
                start=batch.start + lo,
                total=batch.total,
                dim=dim,
                dtype=opts.dtype,
                data=payload[a:b].tobytes(),
                tokens=tokens,
                timings=timings,
                offsets=offsets[lo : hi + 1] - offsets[lo],
                indices=None if indices is None else indices[a:b],
            )
            tokens = 0
            outgoing.add(batch.replies, work.reply, encode(result), work.carrier)

    def _refusal(
        self, request_id: str, error: ServiceError, trace: TraceContext | None = None, work: Work | None = None
    ) -> bytes:
        """``error`` logged, counted, and recorded in the work's span (``work``: its stay) or a span of its
        refusal (``trace``); returns the encoded ErrorReply."""
        log.info("request %s: %s: %s", request_id or "?", error.code.value, error.text())
        self.metrics.error(error.code.value)
        if work is not None:
            record_work(self._tracer, work, "worker embed", error)
        elif trace is not None and trace.sampled and self._tracer.enabled:
            with self._tracer.start("worker embed", trace, "consumer", request_id=request_id) as span:
                span.error(error.code.value, error.text())
        return encode(ErrorReply(request_id, error.code, error.message, error.row))

    async def _reply_error(self, work: Work, error: ServiceError) -> None:
        """Answer ``work`` with ``error`` (on the subject this process may answer its requester on)."""
        payload = self._refusal(work.batch.id, error, work=work)
        try:
            await self._nc.publish(*answer(work.reply, work.carrier or work.reply, payload))
        except Exception as exc:  # called from the replica loops too, which must keep running
            log.warning("request %s: error reply not sent: %r", work.batch.id or "?", exc)


def _step_args(batch: Batch) -> tuple:
    """``Engine.step``'s arguments for a batch of token rows."""
    return (
        batch.input_ids,
        batch.cu_seqlens,
        batch.token_types,
        batch.skip,
        batch.outputs,
        batch.spans,
        batch.adapters,
        batch.pages,
    )
