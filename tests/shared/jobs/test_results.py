"""Reading a job's stored results back on a real nats-server: parts stored twice read once, rows of
another form left out, an empty subject read at once, and results that vanish while being read said
(shared/jobs/results.py; the route and `jobs fetch` over it: tests/integration/test_job_results.py)."""

from __future__ import annotations

import asyncio
import time
import uuid

import nats
import numpy as np
import pytest

from embedfleet.shared.jobs.results import JobForm, ResultsLost, StoredResults
from embedfleet.shared.jobs.streams import ensure_streams, stream_names
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import JobResult, encode


def _result(job: str, batch: int, rows: np.ndarray, dtype: str = "f4") -> bytes:
    ids = [f"{batch}-{i}" for i in range(len(rows))]
    return encode(JobResult(job, batch, 0, ids, rows.shape[1], dtype, rows.astype(f"<{dtype}").tobytes(), 5))


def _run(nats_url: str, body) -> None:
    async def main() -> None:
        nc = await nats.connect(nats_url)
        try:
            subjects = Subjects(f"t{uuid.uuid4().hex[:8]}")
            js = nc.jetstream()
            await ensure_streams(js, subjects)
            await body(js, subjects)
        finally:
            await nc.close()

    asyncio.run(main())


def test_each_part_once_and_only_the_jobs_form(nats_url):
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)

    async def body(js, subjects):
        stored = [
            _result("j", 0, rows),
            _result("j", 1, rows[:2]),
            _result("j", 0, rows),
            _result("j", 2, rows, "f2"),
            _result("j", 3, rows[:, :2]),
        ]
        for n, data in enumerate(stored):  # ids of their own: as if stored after the duplicate window
            await js.publish(subjects.results("j"), data, headers={"Nats-Msg-Id": f"j:{n}"})
        reader = StoredResults(js, subjects, "j", JobForm("float32", "dense"))
        assert await reader.open() == 5
        parts = [part async for part in reader]
        await reader.close()
        assert [(p.batch, p.doc_ids) for p in parts] == [(0, ["0-0", "0-1", "0-2"]), (1, ["1-0", "1-1"])]
        np.testing.assert_array_equal(parts[0].rows, rows)
        assert reader.dim == 4

    _run(nats_url, body)


def test_a_job_with_nothing_stored_is_read_at_once(nats_url):
    async def body(js, subjects):
        reader = StoredResults(js, subjects, "none", JobForm("int8", "dense"))
        started = time.monotonic()
        assert await reader.open() == 0
        assert [part async for part in reader] == []
        assert time.monotonic() - started < 2.0  # no fetch waited for results that are not there

    _run(nats_url, body)


def test_results_gone_while_read_are_said(nats_url, monkeypatch):
    monkeypatch.setattr("embedfleet.shared.jobs.results.FETCH_WAIT", 0.5)

    async def body(js, subjects):
        await js.publish(subjects.results("gone"), _result("gone", 0, np.ones((2, 4))), headers={"Nats-Msg-Id": "g:0"})
        reader = StoredResults(js, subjects, "gone", JobForm("float32", "dense"))
        assert await reader.open() == 1
        await js.purge_stream(stream_names(subjects)["results"], subject=subjects.results("gone"))
        with pytest.raises(
            ResultsLost, match="job gone: the results stream stopped answering with 1 of its 1 results unread"
        ):
            [part async for part in reader]
        await reader.close()

    _run(nats_url, body)


def test_a_consumer_lost_mid_read_is_opened_again_after_the_last_result(nats_url, monkeypatch):
    """Its consumer deleted after two of five results (as the server does to one inactive too long):
    the reader goes on from the third, each result once; closed, it leaves no consumer behind."""
    monkeypatch.setattr("embedfleet.shared.jobs.results.FETCH", 1)
    monkeypatch.setattr("embedfleet.shared.jobs.results.FETCH_WAIT", 0.5)

    async def body(js, subjects):
        for b in range(5):
            await js.publish(
                subjects.results("lost"), _result("lost", b, np.full((2, 4), b)), headers={"Nats-Msg-Id": f"l:{b}"}
            )
        reader = StoredResults(js, subjects, "lost", JobForm("float32", "dense"))
        assert await reader.open() == 5
        batches = []
        async for part in reader:
            batches.append(part.batch)
            if len(batches) == 2:
                await js.delete_consumer(stream_names(subjects)["results"], reader._psub._consumer)
        assert batches == [0, 1, 2, 3, 4]
        await reader.close()
        assert (await js.stream_info(stream_names(subjects)["results"])).state.consumer_count == 0

    _run(nats_url, body)
