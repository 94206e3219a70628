"""The gateway's metrics: stage seconds by model, and bulk-job health read from (fake) JetStream:
consumer lag per stage, job progress, jobs by status; series of gone consumers and old jobs removed."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from nats.js.errors import KeyNotFoundError, NoKeysError

from embedfleet.services.gateway.jobs.metrics import KEEP_FINISHED
from embedfleet.services.gateway.metrics import Metrics
from embedfleet.shared.nats.subjects import Subjects
from tests.support.prometheus_text import has, value
from tests.support.waiting import eventually

NOW = 1_000_000.0
STREAMS = {"EMBEDFLEET_JOBS": "tokenizer", "EMBEDFLEET_BULK": "worker"}


class FakeJetStream:
    def __init__(self, consumers: dict[str, list[tuple[str, int, int]]]) -> None:
        self.consumers = consumers  # stream -> [(name, pending, ack pending)]
        self.calls = 0

    async def consumers_info(self, stream: str):
        self.calls += 1
        return [SimpleNamespace(name=n, num_pending=p, num_ack_pending=a) for n, p, a in self.consumers.get(stream, [])]


# what a submission records besides model and documents (shared/jobs/state.py's SUBMISSION)
SUBMITTED = {"input": "inline", "embedding_type": "float32", "output": "dense"}


class FakeBucket:
    def __init__(self, states: dict[str, dict]) -> None:
        self.states = states
        self.reads: list[str] = []
        self.listings = 0  # keys() calls
        self.status_calls = 0

    async def status(self):
        """The bucket's stream: its sequence numbers move with every change of a state, as a real one's do."""
        self.status_calls += 1
        seq = hash(json.dumps(self.states, sort_keys=True))
        return SimpleNamespace(
            stream_info=SimpleNamespace(state=SimpleNamespace(first_seq=1, last_seq=seq, messages=len(self.states)))
        )

    async def keys(self):
        self.listings += 1
        if not self.states:
            raise NoKeysError
        return list(self.states)

    async def get(self, key: str):
        self.reads.append(key)
        if key not in self.states:
            raise KeyNotFoundError
        return SimpleNamespace(value=json.dumps(self.states[key]).encode(), revision=1)


def _text(metrics: Metrics) -> str:
    return metrics.render().decode()


def test_stage_seconds_by_model():
    metrics = Metrics()
    metrics.observe_stages("a", 10, {"tokenize": 0.001, "queue": 0.002, "inference": 0.01})
    metrics.observe_stages("a", 5, {"tokenize": 0.003, "inference": 0.02})
    metrics.observe_stages("b", 7, {"inference": 0.5})
    text = _text(metrics)
    assert value(text, "embedfleet_model_stage_seconds_count", model="a", stage="inference") == 2
    assert value(text, "embedfleet_model_stage_seconds_sum", model="a", stage="inference") == pytest.approx(0.03)
    assert value(text, "embedfleet_model_stage_seconds_count", model="a", stage="queue") == 1
    assert value(text, "embedfleet_model_stage_seconds_sum", model="b", stage="inference") == 0.5
    assert not has(text, "embedfleet_model_stage_seconds_count", model="b", stage="queue")
    # the overall histogram is as before (no model label)
    assert value(text, "embedfleet_stage_seconds_count", stage="inference") == 3
    assert value(text, "embedfleet_tokens_total", model="a") == 15


def test_lag_per_stage_and_job_progress():
    metrics = Metrics()
    js = FakeJetStream({"EMBEDFLEET_JOBS": [("tokenizers-m", 3, 1)], "EMBEDFLEET_BULK": [("workers-m", 0, 2)]})
    kv = FakeBucket(
        {
            "run": {
                **SUBMITTED,
                "job": "run",
                "model": "m",
                "status": "running",
                "documents": 100,
                "done": 40,
                "failed": 2,
            },
            "old": {
                **SUBMITTED,
                "job": "old",
                "model": "m",
                "status": "done",
                "documents": 5,
                "done": 5,
                "finished": NOW - KEEP_FINISHED - 1,
            },
            "new": {
                **SUBMITTED,
                "job": "new",
                "model": "m",
                "status": "done_with_errors",
                "documents": 9,
                "done": 8,
                "failed": 1,
                "finished": NOW - 10,
            },
        }
    )
    asyncio.run(metrics.jobs.refresh(js, kv, STREAMS, now=NOW))
    text = _text(metrics)
    assert value(text, "embedfleet_bulk_lag", stage="tokenizer", consumer="tokenizers-m") == 4
    assert value(text, "embedfleet_bulk_pending", stage="tokenizer", consumer="tokenizers-m") == 3
    assert value(text, "embedfleet_bulk_ack_pending", stage="tokenizer", consumer="tokenizers-m") == 1
    assert value(text, "embedfleet_bulk_lag", stage="worker", consumer="workers-m") == 2
    assert value(text, "embedfleet_job_documents", job_id="run", model="m", state="total") == 100
    assert value(text, "embedfleet_job_documents", job_id="run", model="m", state="done") == 40
    assert value(text, "embedfleet_job_documents", job_id="run", model="m", state="failed") == 2
    assert value(text, "embedfleet_job_documents", job_id="new", model="m", state="failed") == 1  # just finished: kept
    assert not has(text, "embedfleet_job_documents", job_id="old", model="m", state="total")  # finished long ago
    assert value(text, "embedfleet_jobs", status="running") == 1
    assert value(text, "embedfleet_jobs", status="done") == 1
    assert value(text, "embedfleet_jobs", status="done_with_errors") == 1
    assert value(text, "embedfleet_bulk_metrics_updated") == NOW

    # later: the tokenizers' consumer is gone, the running job finished, the old one was deleted
    js.consumers["EMBEDFLEET_JOBS"] = []
    js.consumers["EMBEDFLEET_BULK"] = [("workers-m", 0, 0)]
    kv.states["run"].update(status="done", done=98, finished=NOW + 1)
    del kv.states["old"]
    kv.reads.clear()
    asyncio.run(metrics.jobs.refresh(js, kv, STREAMS, now=NOW + 5))
    text = _text(metrics)
    assert not has(text, "embedfleet_bulk_lag", stage="tokenizer", consumer="tokenizers-m")
    assert value(text, "embedfleet_bulk_lag", stage="worker", consumer="workers-m") == 0
    assert value(text, "embedfleet_job_documents", job_id="run", model="m", state="done") == 98
    assert value(text, "embedfleet_jobs", status="running") == 0  # none left: 0, not a vanished series
    assert value(text, "embedfleet_jobs", status="done") == 1
    assert kv.reads == ["run", "progress.run"]  # a finished job's state (its record and progress) is read once

    # every job gone from the bucket
    kv.states.clear()
    asyncio.run(metrics.jobs.refresh(js, kv, STREAMS, now=NOW + 10))
    text = _text(metrics)
    assert not has(text, "embedfleet_job_documents", job_id="run", model="m", state="done")
    assert value(text, "embedfleet_jobs", status="done") == 0


def test_refreshes_in_the_background_until_stopped():
    async def main() -> tuple[int, int]:
        jobs = Metrics().jobs
        js = FakeJetStream({})
        jobs.start(js, FakeBucket({}), Subjects("embedfleet"), interval=0.01)
        await eventually(lambda: js.calls >= 6, 5, "six refresh calls")
        await jobs.stop()
        seen = js.calls
        await asyncio.sleep(0.05)  # the sleep is the test: five refresh intervals pass with no call
        return seen, js.calls

    seen, later = asyncio.run(main())
    assert seen >= 6  # two streams a refresh, refreshed again and again
    assert later == seen  # stopped


def test_a_failed_refresh_keeps_the_loop_and_the_last_values():
    class Failing(FakeJetStream):
        async def consumers_info(self, stream):
            self.calls += 1
            raise TimeoutError("nats is away")

    async def main() -> int:
        jobs = Metrics().jobs
        js = Failing({})
        jobs.start(js, FakeBucket({}), Subjects("embedfleet"), interval=0.01)
        await eventually(lambda: js.calls >= 3, 5, "three failed refreshes")
        await jobs.stop()
        return js.calls

    assert asyncio.run(main()) >= 3


def test_an_unchanged_bucket_is_not_listed_again():
    """Nothing written to the job bucket since the last refresh: its keys are not listed (a consumer the
    server makes and removes) and no state is read; the gauges stay, a finished job's still ages out."""
    metrics = Metrics()
    js = FakeJetStream({})
    kv = FakeBucket(
        {
            "new": {
                **SUBMITTED,
                "job": "new",
                "model": "m",
                "status": "done",
                "documents": 9,
                "done": 9,
                "finished": NOW - 10,
            }
        }
    )
    asyncio.run(metrics.jobs.refresh(js, kv, STREAMS, now=NOW))
    assert (kv.listings, kv.reads) == (1, ["new", "progress.new"])
    asyncio.run(metrics.jobs.refresh(js, kv, STREAMS, now=NOW + 5))
    assert (kv.listings, kv.reads, kv.status_calls) == (1, ["new", "progress.new"], 2)
    assert value(_text(metrics), "embedfleet_job_documents", job_id="new", model="m", state="done") == 9
    asyncio.run(metrics.jobs.refresh(js, kv, STREAMS, now=NOW + KEEP_FINISHED))
    assert not has(_text(metrics), "embedfleet_job_documents", job_id="new", model="m", state="done")
    kv.states["run"] = {**SUBMITTED, "job": "run", "model": "m", "status": "running", "documents": 4, "done": 1}
    asyncio.run(metrics.jobs.refresh(js, kv, STREAMS, now=NOW + KEEP_FINISHED + 1))
    assert kv.listings == 2
    assert value(_text(metrics), "embedfleet_job_documents", job_id="run", model="m", state="done") == 1
