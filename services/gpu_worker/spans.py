"""The worker's spans of one piece of work: its stay in the worker, with its wait in the queue and
the forwards its rows were in as children. Measured while the work ran (perf_counter), recorded
when it is answered, so the replica loops pay nothing for them while tracing is off."""

from __future__ import annotations

import time

from embedfleet.services.gpu_worker.scheduler import Work
from embedfleet.shared.errors import ServiceError
from embedfleet.shared.observability.tracing import TraceContext, Tracer, wall_ns


def record_work(tracer: Tracer, work: Work, name: str, error: ServiceError | None = None) -> TraceContext | None:
    """Record ``work``'s spans, ended now; the context what it hands on (its stored result's parent)."""
    if not tracer.enabled or work.trace is None or not work.trace.sampled:
        return work.trace
    now_perf, now_ns = time.perf_counter(), time.time_ns()
    arrived = wall_ns(work.arrived, now_perf, now_ns) if work.arrived else now_ns
    batch = work.batch
    span = tracer.start(
        name,
        work.trace,
        "consumer",
        start_ns=arrived,
        request_id=batch.id,
        model=batch.model,
        rows=batch.count,
        tokens=batch.num_tokens,
    )
    if work.started is not None:
        started = wall_ns(work.started, now_perf, now_ns)
        tracer.record("queue", span.context, arrived, started)
        tracer.record("inference", span.context, started, started + int(work.inference * 1e9), tokens=batch.num_tokens)
    if error is not None:
        span.error(error.code.value, error.text())
    span.end(now_ns)
    return span.context
