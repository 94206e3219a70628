"""The job streams' and bucket's retention on a real nats-server: limits set on creation, an existing
stream or bucket brought to new limits in place (its contents kept), unset limits left as they are,
and results and records gone once they are older than their limits."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import replace

import nats
import pytest

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.config.sections.bulk import JOB_TTL, RESULTS_MAX_AGE
from embedfleet.shared.jobs.bucket import progress_key, purge_state, read_state, update_state
from embedfleet.shared.jobs.settings import Retention
from embedfleet.shared.jobs.state import JobState
from embedfleet.shared.jobs.streams import DUPLICATE_WINDOW, bucket_stream, ensure_streams, job_bucket, stream_names
from embedfleet.shared.nats.subjects import Subjects


def _run(nats_url: str, body) -> None:
    async def main() -> None:
        nc = await nats.connect(nats_url)
        try:
            await body(nc.jetstream(), Subjects(f"t{uuid.uuid4().hex[:8]}"))
        finally:
            await nc.close()

    asyncio.run(main())


async def _configs(js, subjects: Subjects):
    results = (await js.stream_info(stream_names(subjects)["results"])).config
    bucket = (await js.stream_info(bucket_stream(subjects))).config
    return results, bucket


def test_new_streams_get_the_limits_given(nats_url):
    async def body(js, subjects):
        assert await job_bucket(js, subjects) is None  # nothing made yet, and looking makes nothing
        kv = await ensure_streams(
            js, subjects, Retention(results_max_age=3600, results_max_bytes=5_000_000, job_ttl=7200, job_history=5)
        )
        results, bucket = await _configs(js, subjects)
        assert (results.max_age, results.max_bytes, results.duplicate_window) == (3600, 5_000_000, DUPLICATE_WINDOW)
        assert (bucket.max_age, bucket.max_msgs_per_subject) == (7200, 5)
        for n in range(7):
            await update_state(kv, "j", lambda s, n=n: replace(s, done=n))
        history = await kv.history(progress_key("j"))  # counts: the job's progress key
        assert [json.loads(e.value).get("done", 0) for e in history] == [2, 3, 4, 5, 6]  # 5 revisions kept
        assert await job_bucket(js, subjects) is not None

    _run(nats_url, body)


def test_none_given_means_the_defaults_on_creation(nats_url):
    async def body(js, subjects):
        await ensure_streams(js, subjects)
        results, bucket = await _configs(js, subjects)
        assert (results.max_age, results.max_bytes) == (RESULTS_MAX_AGE, -1)
        assert (bucket.max_age, bucket.max_msgs_per_subject) == (JOB_TTL, 1)

    _run(nats_url, body)


def test_an_existing_stream_and_bucket_are_updated_in_place_and_unset_limits_stay(nats_url):
    async def body(js, subjects):
        kv = await ensure_streams(js, subjects)
        await js.publish(subjects.results("j"), b"vectors", headers={"Nats-Msg-Id": "j:0:0"})
        await update_state(kv, "j", lambda s: replace(s, done=1))

        kv = await ensure_streams(
            js, subjects, Retention(results_max_age=60, results_max_bytes=1 << 20, job_ttl=120, job_history=3)
        )
        results, bucket = await _configs(js, subjects)
        # a duplicate window longer than the age limit is refused by the server: it shrinks with it
        assert (results.max_age, results.max_bytes, results.duplicate_window) == (60, 1 << 20, 60)
        assert (bucket.max_age, bucket.max_msgs_per_subject) == (120, 3)
        assert (await read_state(kv, "j")).done == 1  # nothing lost
        info = await js.stream_info(stream_names(subjects)["results"], subjects_filter=subjects.results("j"))
        assert info.state.subjects == {subjects.results("j"): 1}

        # a process given no limits (a reindex run by hand) leaves the fleet's as they are
        await ensure_streams(js, subjects)
        results, bucket = await _configs(js, subjects)
        assert (results.max_age, results.max_bytes, bucket.max_age, bucket.max_msgs_per_subject) == (
            60,
            1 << 20,
            120,
            3,
        )
        # one limit changed, the others kept; 0 lifts a limit
        await ensure_streams(js, subjects, Retention(results_max_age=0, results_max_bytes=0, job_history=2))
        results, bucket = await _configs(js, subjects)
        assert (results.max_age, results.max_bytes) == (0, -1)
        assert (bucket.max_age, bucket.max_msgs_per_subject) == (120, 2)

    _run(nats_url, body)


@pytest.mark.slow  # waits out the age limits
def test_results_and_records_expire_after_their_age(nats_url):
    async def body(js, subjects):
        kv = await ensure_streams(js, subjects, Retention(results_max_age=1, job_ttl=1))
        await js.publish(subjects.results("old"), b"vectors", headers={"Nats-Msg-Id": "old:0:0"})
        await update_state(kv, "old", lambda s: replace(s, done=1))
        stream = stream_names(subjects)["results"]
        assert (await js.stream_info(stream)).state.messages == 1 and await read_state(kv, "old") is not None
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if (await js.stream_info(stream)).state.messages == 0 and await read_state(kv, "old") is None:
                return
            await asyncio.sleep(0.2)
        pytest.fail("a result and a record older than their limits are still there")

    _run(nats_url, body)


@pytest.mark.slow  # waits out a duplicate window
def test_a_purged_job_waits_out_the_duplicate_window(nats_url, monkeypatch):
    import embedfleet.shared.jobs.streams

    monkeypatch.setattr(embedfleet.shared.jobs.streams, "DUPLICATE_WINDOW", 2.0)

    async def body(js, subjects):
        kv = await ensure_streams(js, subjects)
        assert await embedfleet.shared.jobs.streams.purge_wait(js, subjects, "never") == 0  # no such job
        await update_state(kv, "j", lambda s: replace(s, done=1))
        assert await embedfleet.shared.jobs.streams.purge_wait(js, subjects, "j") == 0  # a job with its record
        await purge_state(kv, "j")
        assert 1.0 < await embedfleet.shared.jobs.streams.purge_wait(js, subjects, "j") <= 2.0
        await asyncio.sleep(2.1)  # the sleep is the test: the duplicate window passes
        assert await embedfleet.shared.jobs.streams.purge_wait(js, subjects, "j") == 0
        await update_state(kv, "j", lambda s: replace(s, done=s.done + 2))  # a purged key takes a record again
        assert (await read_state(kv, "j")) == JobState("j", done=2)

    _run(nats_url, body)


@pytest.mark.parametrize(
    "fields, fragment",
    [
        ({"results_max_age": 0.5}, "--results-max-age 0.5: give 0 (no age limit) or at least 1 second"),
        ({"job_ttl": -1}, "--job-ttl -1"),
        ({"results_max_bytes": -5}, "--results-max-bytes -5"),
        ({"job_history": 65}, "--job-history 65: must be in 1..64"),
        ({"job_history": 0}, "--job-history 0"),
    ],
)
def test_bad_limits_are_refused(fields, fragment):
    with pytest.raises(ConfigError) as exc:
        Retention(**fields)
    assert fragment in str(exc.value)


def test_limits_reach_a_child_process_as_variables():
    assert Retention(results_max_age=60.0, job_history=3).environment() == {
        "EMBEDFLEET_RESULTS_MAX_AGE": "60.0",
        "EMBEDFLEET_JOB_HISTORY": "3",
    }
