"""The worker's metrics, fed batches cut by a real scheduler: counts by queue, sizes, forward time by
token class, how forwards ran, busy time per replica (overlapping batches counted once), queue gauges."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import generate_latest

from embedfleet.services.gpu_worker.metrics import WorkerMetrics, token_class
from embedfleet.services.gpu_worker.scheduler import Scheduler, Work
from embedfleet.shared.protocol import TokenChunk
from tests.support.prometheus_text import has, value


def _work(request_id: str, lengths: list[int], bulk: bool = False) -> Work:
    cu = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=cu[1:])
    batch = TokenChunk(request_id, "m", 0, len(lengths), np.arange(cu[-1], dtype=np.int32), cu, 1e12)
    return Work(batch, reply="" if bulk else f"inbox.{request_id}", source=object() if bulk else None)


def _text(metrics: WorkerMetrics) -> str:
    return generate_latest(metrics.registry).decode()


@pytest.mark.parametrize(
    "tokens, label", [(1, "32"), (32, "32"), (33, "64"), (513, "1024"), (16384, "16384"), (16385, "+Inf")]
)
def test_token_class(tokens, label):
    assert token_class(tokens) == label


def test_batches_tokens_rows_and_sizes_by_queue():
    scheduler = Scheduler(max_tokens=100, max_seqs=16)
    metrics = WorkerMetrics("m", scheduler, 100)
    scheduler.push(_work("a", [5, 7]))
    scheduler.push(_work("job", [10, 20, 30], bulk=True), bulk=True)
    text = _text(metrics)
    assert value(text, "embedfleet_worker_queue_depth", model="m", queue="online") == 1
    assert value(text, "embedfleet_worker_queue_depth", model="m", queue="bulk") == 1
    assert value(text, "embedfleet_worker_queued_tokens", model="m") == 72
    assert value(text, "embedfleet_worker_max_batch_tokens", model="m") == 100

    online = scheduler.next_batch()
    metrics.batch_done(0, online, "eager", launched=10.0, took=0.25)
    bulk = scheduler.next_batch()
    metrics.batch_done(0, bulk, "replay", launched=10.5, took=0.5)
    text = _text(metrics)
    assert value(text, "embedfleet_worker_batches_total", model="m", queue="online") == 1
    assert value(text, "embedfleet_worker_batches_total", model="m", queue="bulk") == 1
    assert value(text, "embedfleet_worker_tokens_total", model="m", queue="online") == 12
    assert value(text, "embedfleet_worker_tokens_total", model="m", queue="bulk") == 60
    assert value(text, "embedfleet_worker_rows_total", model="m", queue="bulk") == 3
    assert value(text, "embedfleet_worker_batch_tokens_count", model="m") == 2
    assert value(text, "embedfleet_worker_batch_tokens_sum", model="m") == 72
    assert value(text, "embedfleet_worker_batch_tokens_bucket", model="m", le="16.0") == 1  # 12 <= 16 < 60
    assert value(text, "embedfleet_worker_batch_rows_sum", model="m") == 5
    assert value(text, "embedfleet_worker_forward_seconds_count", model="m", tokens="32") == 1
    assert value(text, "embedfleet_worker_forward_seconds_sum", model="m", tokens="64") == 0.5
    assert value(text, "embedfleet_worker_forwards_total", model="m", run="eager") == 1
    assert value(text, "embedfleet_worker_forwards_total", model="m", run="replay") == 1
    assert value(text, "embedfleet_worker_forwards_total", model="m", run="captured") == 0
    assert value(text, "embedfleet_worker_queue_depth", model="m", queue="online") == 0
    assert value(text, "embedfleet_worker_queued_tokens", model="m") == 0


def test_busy_time_counts_overlapping_batches_once_per_replica():
    scheduler = Scheduler(max_tokens=10, max_seqs=16)
    metrics = WorkerMetrics("m", scheduler, 10)
    for i in range(4):
        scheduler.push(_work(str(i), [8]))
    a, b, c, d = (scheduler.next_batch() for _ in range(4))
    metrics.batch_done(0, a, "eager", launched=100.0, took=1.0)  # replica 0: 100 .. 101
    metrics.batch_done(0, b, "eager", launched=100.5, took=1.0)  # launched while a ran: 101 .. 101.5 is new
    metrics.batch_done(0, c, "eager", launched=103.0, took=0.25)  # idle before it
    metrics.batch_done(1, d, "eager", launched=100.0, took=2.0)  # another replica counts on its own
    text = _text(metrics)
    assert value(text, "embedfleet_worker_busy_seconds_total", model="m", replica="0") == pytest.approx(1.75)
    assert value(text, "embedfleet_worker_busy_seconds_total", model="m", replica="1") == pytest.approx(2.0)


def test_errors_by_code_and_failed_batches():
    scheduler = Scheduler(max_tokens=10, max_seqs=16)
    metrics = WorkerMetrics("m", scheduler, 10)
    metrics.error("overloaded")
    metrics.error("overloaded")
    metrics.error("timeout")
    scheduler.push(_work("job", [4], bulk=True), bulk=True)
    metrics.batch_failed(scheduler.next_batch())
    text = _text(metrics)
    assert value(text, "embedfleet_worker_errors_total", model="m", code="overloaded") == 2
    assert value(text, "embedfleet_worker_errors_total", model="m", code="timeout") == 1
    assert not has(text, "embedfleet_worker_errors_total", model="m", code="internal")
    assert value(text, "embedfleet_worker_failed_batches_total", model="m", queue="bulk") == 1
    assert value(text, "embedfleet_worker_failed_batches_total", model="m", queue="online") == 0


def test_each_worker_has_its_own_registry():
    a = WorkerMetrics("m", Scheduler(10, 4), 10)
    b = WorkerMetrics("m", Scheduler(10, 4), 10)  # a second one in one process: no duplicate-series error
    a.error("timeout")
    assert not has(_text(b), "embedfleet_worker_errors_total", model="m", code="timeout")
