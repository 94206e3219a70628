"""Bulk-job health on the gateway's metrics: each stage's JetStream consumer lag and each job's progress.

Read from NATS in the background every ``--job-metrics-interval`` seconds (never while a request or a scrape waits):
the consumers of the jobs stream (the tokenizers', one per model) and of the bulk stream (the
workers'), and the job states in the job bucket. The states are read again only when the bucket's
stream changed since (a write, a deletion or an expiry moves its sequence numbers or its count): an
idle bucket costs one stream-info request a refresh, not a listing of its keys (which makes the server
create and remove a consumer). A finished job's state no longer changes, so it is read once; its
gauges stay ``KEEP_FINISHED`` seconds after it finished, so its last values are scraped.

On a gateway with API keys a job belongs to the key that made it, and /metrics is open (--open-paths)
or read with any key: a job's ``job_id`` label is then a digest of its id (``job_label``), which tells
nothing of the id to whoever does not know it, and which its owner can compute.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time

from nats.js.errors import NoKeysError
from prometheus_client import CollectorRegistry, Gauge

from embedfleet.shared.jobs.bucket import has_state_key, read_state
from embedfleet.shared.jobs.state import DONE, DONE_WITH_ERRORS, RUNNING, JobState, JobStateError
from embedfleet.shared.jobs.streams import stream_names
from embedfleet.shared.nats.lifecycle import cancel
from embedfleet.shared.nats.subjects import Subjects

log = logging.getLogger("embedfleet.gateway.metrics")

KEEP_FINISHED = 300.0
FINISHED = (DONE, DONE_WITH_ERRORS)
STAGES = {"jobs": "tokenizer", "bulk": "worker"}  # stream (shared/jobs/streams.py) -> the stage consuming it
STATES = ("total", "done", "failed")  # a job's documents: all, stored, given up


def job_label(job: str, hidden: bool) -> str:
    """A job's ``job_id`` label: its id, or when ids are hidden the first 16 hex digits of its SHA-256
    (``printf %s JOB_ID | sha256sum | cut -c1-16``)."""
    return hashlib.sha256(job.encode()).hexdigest()[:16] if hidden else job


class JobMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        stage = ["stage", "consumer"]
        self._lag = Gauge(
            "embedfleet_bulk_lag",
            "bulk batches a stage has not acknowledged: waiting plus delivered and "
            "unacknowledged (num_pending + num_ack_pending of its JetStream consumer)",
            stage,
            registry=registry,
        )
        self._pending = Gauge(
            "embedfleet_bulk_pending",
            "bulk batches waiting for a stage's consumer, not delivered yet",
            stage,
            registry=registry,
        )
        self._ack_pending = Gauge(
            "embedfleet_bulk_ack_pending",
            "bulk batches a stage holds: delivered, not acknowledged",
            stage,
            registry=registry,
        )
        self._documents = Gauge(
            "embedfleet_job_documents",
            "documents of a running (or just finished) job, by state: "
            "total, done (stored), failed (given up); job_id a digest of the id where API keys are on",
            ["job_id", "model", "state"],
            registry=registry,
        )
        self._jobs = Gauge("embedfleet_jobs", "jobs in the job bucket, by status", ["status"], registry=registry)
        self._updated = Gauge(
            "embedfleet_bulk_metrics_updated",
            "unix time the bulk and job gauges were last read from NATS",
            registry=registry,
        )
        self._consumers: set[tuple[str, str]] = set()
        self._shown: set[tuple[str, str]] = set()  # (job, model) with gauges
        self._statuses: set[str] = set()
        self._finished: dict[str, JobState] = {}  # job -> its final state
        self._states: dict[str, JobState] = {}  # job -> its state, as last read
        self._bucket: tuple[int, int, int] | None = None  # the bucket stream's (first seq, last seq, messages) then
        self._task: asyncio.Task | None = None
        self._hidden = False  # job ids shown as digests

    def start(self, js, kv, subjects: Subjects, interval: float, hide_ids: bool = False) -> None:
        self._hidden = hide_ids
        self._task = asyncio.create_task(self._run(js, kv, subjects, interval), name="job-metrics")

    async def stop(self) -> None:
        await cancel(self._task)
        self._task = None

    async def _run(self, js, kv, subjects: Subjects, interval: float) -> None:
        names = stream_names(subjects)
        while True:
            try:
                await self.refresh(js, kv, {names[s]: stage for s, stage in STAGES.items()})
            except Exception as exc:  # NATS away or JetStream off: the gauges keep their last values
                log.debug("bulk metrics not refreshed: %r", exc)
            await asyncio.sleep(interval)

    async def refresh(self, js, kv, streams: dict[str, str], now: float | None = None) -> None:
        """Read the consumers of ``streams`` (stream -> stage) and the job states once; set the gauges."""
        now = time.time() if now is None else now
        consumers: dict[tuple[str, str], tuple[int, int]] = {}
        for stream, stage in streams.items():
            for info in await js.consumers_info(stream):
                consumers[(stage, info.name)] = (info.num_pending or 0, info.num_ack_pending or 0)
        for key in self._consumers - set(consumers):
            for gauge in (self._lag, self._pending, self._ack_pending):
                gauge.remove(*key)
        for key, (pending, ack_pending) in consumers.items():
            self._pending.labels(*key).set(pending)
            self._ack_pending.labels(*key).set(ack_pending)
            self._lag.labels(*key).set(pending + ack_pending)
        self._consumers = set(consumers)
        self._show_jobs(await self._job_states(kv), now)
        self._updated.set(now)

    async def _job_states(self, kv) -> dict[str, JobState]:
        state = (await kv.status()).stream_info.state
        bucket = (state.first_seq, state.last_seq, state.messages)
        if bucket != self._bucket:
            self._states = await self._read_states(kv)
            self._bucket = bucket
        return self._states

    async def _read_states(self, kv) -> dict[str, JobState]:
        try:
            keys = await kv.keys()
        except NoKeysError:
            keys = []
        self._finished = {job: state for job, state in self._finished.items() if job in keys}  # expired or deleted
        states = {}
        for job in keys:
            if not has_state_key(job):  # a job's progress key: read with its record
                continue
            try:
                state = self._finished.get(job) or await read_state(kv, job)
            except JobStateError as exc:  # not one this code wrote: no gauges of it, the others' shown
                log.warning("%s: not shown", exc)
                continue
            if state is None:
                continue
            if state.status in FINISHED:
                self._finished[job] = state
            states[job] = state
        return states

    def _show_jobs(self, states: dict[str, JobState], now: float) -> None:
        counts: dict[str, int] = {}
        shown = set()
        for job, state in states.items():
            status = state.status or RUNNING
            counts[status] = counts.get(status, 0) + 1
            if status in FINISHED and state.finished is not None and now - state.finished > KEEP_FINISHED:
                continue
            key = (job_label(job, self._hidden), state.model or "")
            shown.add(key)
            values = {"total": state.documents or 0, "done": state.done, "failed": state.failed}
            for name, value in values.items():
                self._documents.labels(*key, name).set(value)
        for key in self._shown - shown:
            for name in STATES:
                self._documents.remove(*key, name)
        self._shown = shown
        for status in self._statuses - set(counts):
            self._jobs.labels(status).set(0)  # none left: 0, not a vanished series
        for status, n in counts.items():
            self._jobs.labels(status).set(n)
        self._statuses |= set(counts)
