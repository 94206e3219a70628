"""Prometheus metrics of one worker (its own registry, no process-global state): engine batches and
their sizes, forward time by batch size, queues, how forwards ran (CUDA graphs), errors, busy time.

Counters are updated on the event loop once per engine batch; the queue gauges are read from the
scheduler when scraped, so waiting work costs nothing until someone looks.
"""

from __future__ import annotations

import bisect
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from embedfleet.services.gpu_worker.scheduler import Batch, Scheduler

QUEUES = ("online", "bulk")
RUNS = ("eager", "captured", "replay")  # see Engine.step: the handle's ``run``
# forward time is labelled by the batch's tokens rounded up to one of these (then "+Inf"): a bounded
# label set on every device, where CUDA-graph buckets (multiples of 64, then 256) would be dozens
TOKEN_CLASSES = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_TOKENS = tuple(float(2**i) for i in range(4, 17))  # 16 .. 65536 tokens per batch
_ROWS = tuple(float(2**i) for i in range(13))  # 1 .. 4096 sequences per batch


def token_class(tokens: int) -> str:
    """The label of a batch of ``tokens`` tokens: the smallest class holding it, or "+Inf"."""
    i = bisect.bisect_left(TOKEN_CLASSES, tokens)
    return str(TOKEN_CLASSES[i]) if i < len(TOKEN_CLASSES) else "+Inf"


def batch_queue(batch: Batch) -> str:
    """The queue a batch was cut from (a batch never mixes them: see Scheduler.next_batch)."""
    return "bulk" if batch.slices and batch.slices[0].work.source is not None else "online"


class WorkerMetrics:
    def __init__(self, model: str, scheduler: Scheduler, max_batch_tokens: int) -> None:
        self.registry = r = CollectorRegistry()
        self._model = model
        by_queue = ["model", "queue"]
        batches = Counter(
            "embedfleet_worker_batches", "engine batches run, by queue (online or bulk)", by_queue, registry=r
        )
        tokens = Counter(
            "embedfleet_worker_tokens",
            "tokens in engine batches (the sequences' own, no padding)",
            by_queue,
            registry=r,
        )
        rows = Counter("embedfleet_worker_rows", "sequences embedded (or scored)", by_queue, registry=r)
        failed = Counter(
            "embedfleet_worker_failed_batches", "engine batches whose forward or result failed", by_queue, registry=r
        )
        # label children bound once: the per-batch path does no label lookups
        self._batches = {q: batches.labels(model, q) for q in QUEUES}
        self._tokens = {q: tokens.labels(model, q) for q in QUEUES}
        self._rows = {q: rows.labels(model, q) for q in QUEUES}
        self._failed = {q: failed.labels(model, q) for q in QUEUES}
        self._batch_tokens = Histogram(
            "embedfleet_worker_batch_tokens", "tokens per engine batch", ["model"], buckets=_TOKENS, registry=r
        ).labels(model)
        self._batch_rows = Histogram(
            "embedfleet_worker_batch_rows", "sequences per engine batch", ["model"], buckets=_ROWS, registry=r
        ).labels(model)
        self._forward = Histogram(
            "embedfleet_worker_forward_seconds",
            "seconds from an engine batch's launch to its result on the host, by the batch's tokens rounded up to a "
            "power of two (label tokens)",
            ["model", "tokens"],
            buckets=_SECONDS,
            registry=r,
        )
        runs = Counter(
            "embedfleet_worker_forwards",
            "forward passes by how they ran: eager (no CUDA graph), captured "
            "(eager, then its bucket's graph captured), replay (a captured graph)",
            ["model", "run"],
            registry=r,
        )
        self._runs = {k: runs.labels(model, k) for k in RUNS}
        self._errors = Counter(
            "embedfleet_worker_errors",
            "error replies by code (overloaded, timeout, internal, ...)",
            ["model", "code"],
            registry=r,
        )
        self._bundled = Counter(
            "embedfleet_worker_bundled",
            "token batches that came several to a NATS message (a "
            "Requests message: a tokenizer's batches of one group for one requester)",
            ["model"],
            registry=r,
        ).labels(model)
        self._dropped = Counter(
            "embedfleet_worker_dropped_rows",
            "queued rows never run, by reason: cancelled (their requester gave the request up: its client "
            "left) or expired (their batch's deadline passed)",
            ["model", "reason"],
            registry=r,
        )
        for reason in ("cancelled", "expired"):  # each reason's series from the start, at 0
            self._dropped.labels(model, reason)
        self._busy = Counter(
            "embedfleet_worker_busy_seconds",
            "seconds each engine replica had a batch in flight",
            ["model", "replica"],
            registry=r,
        )
        self._last_ready: dict[int, float] = {}
        self._children: dict[tuple[object, str], Any] = {}  # (metric, label) -> its child, looked up once
        depth = Gauge(
            "embedfleet_worker_queue_depth", "token batches waiting in this worker, by queue", by_queue, registry=r
        )
        depth.labels(model, "online").set_function(lambda: scheduler.online_waiting)
        depth.labels(model, "bulk").set_function(lambda: scheduler.bulk_waiting)
        Gauge(
            "embedfleet_worker_queued_tokens", "tokens waiting to be scheduled, online and bulk", ["model"], registry=r
        ).labels(model).set_function(lambda: scheduler.queued_tokens)
        Gauge(
            "embedfleet_worker_max_batch_tokens",
            "the token budget of one engine batch (set or calibrated)",
            ["model"],
            registry=r,
        ).labels(model).set(max_batch_tokens)

    def batch_done(self, replica: int, batch: Batch, run: str, launched: float, took: float) -> None:
        """An engine batch's result is on the host: ``launched`` (perf_counter) + ``took`` seconds."""
        queue = batch_queue(batch)
        tokens, rows = batch.num_tokens, len(batch.cu_seqlens) - 1
        self._batches[queue].inc()
        self._tokens[queue].inc(tokens)
        self._rows[queue].inc(rows)
        self._batch_tokens.observe(tokens)
        self._batch_rows.observe(rows)
        self._child(self._forward, token_class(tokens)).observe(took)
        self._runs[run].inc()
        # on CUDA batch N+1 is launched while batch N runs: count the time covered, not the sum of both
        ready = launched + took
        start = max(launched, self._last_ready.get(replica, launched))
        self._last_ready[replica] = ready
        self._child(self._busy, str(replica)).inc(max(0.0, ready - start))

    def _child(self, metric: Any, label: str) -> Any:
        """``metric.labels(model, label)``, looked up once (prometheus_client checks and locks on each call)."""
        found = self._children.get((metric, label))
        if found is None:
            found = self._children[(metric, label)] = metric.labels(self._model, label)
        return found

    def batch_failed(self, batch: Batch) -> None:
        self._failed[batch_queue(batch)].inc()

    def bundled(self, count: int) -> None:
        self._bundled.inc(count)

    def dropped(self, reason: str, rows: int) -> None:
        self._child(self._dropped, reason).inc(rows)

    def error(self, code: str) -> None:
        self._child(self._errors, code).inc()
