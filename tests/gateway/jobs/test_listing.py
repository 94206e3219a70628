"""GET /v1/jobs' query and paging (services/gateway/jobs/listing.py), without NATS: the records as the
bucket would give them, in any order; who sees which by the real JobOwners with keys bound. Last, the
route's reading (jobs/api.py) on a real nats-server."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Iterable

import nats
import orjson
import pytest

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.http.limits import bind_key
from embedfleet.services.gateway.jobs.listing import (
    DEFAULT_LIMIT,
    JobListQuery,
    job_page,
    page_answer,
    parse_listing,
    place_of,
)
from embedfleet.services.gateway.jobs.owners import JobOwners
from embedfleet.shared.jobs.bucket import update_state
from embedfleet.shared.jobs.claims import make_claim
from embedfleet.shared.jobs.requests import owner_digest
from embedfleet.shared.jobs.state import JobState
from embedfleet.shared.jobs.streams import ensure_streams
from embedfleet.shared.nats.subjects import Subjects
from tests.support.job_states import submitted


def _job(job: str, started: float | None, key: str | None = None, status: str = "done") -> JobState:
    return JobState(
        job,
        status=status,
        model="m",
        input="inline",
        documents=1,
        embedding_type="float32",
        output="dense",
        started=started,
        owner=owner_digest(key) if key else None,
    )


async def _records(states: Iterable[JobState], extra: Iterable[tuple[str, bytes]] = ()) -> AsyncIterator:
    for state in states:
        yield state.job, state.encode()
    for record in extra:
        yield record


def _page(states, query: JobListQuery, sees=lambda owner: True, after=None, extra=()) -> tuple[list[str], bool]:
    page, more = asyncio.run(job_page(_records(states, extra), query, sees, after))
    return [s.job for s in page], more


def _error(params: dict) -> tuple[str, str | None]:
    with pytest.raises(ApiError) as caught:
        parse_listing(params)
    assert caught.value.status == 400
    return caught.value.message, caught.value.param


def test_the_query_s_defaults_and_values():
    assert parse_listing({}) == JobListQuery(limit=DEFAULT_LIMIT)
    assert parse_listing({"limit": "5", "after": "job-1", "status": "running", "other": "x"}) == JobListQuery(
        limit=5, after="job-1", status="running"
    )


def test_a_bad_query_is_a_400_naming_the_parameter():
    assert _error({"limit": "0"}) == ("'limit' must be at least 1, got '0'", "limit")
    assert _error({"limit": "101"}) == ("'limit' must be at most 100, got '101'", "limit")
    assert _error({"limit": "ten"}) == ("'limit' must be an integer, got 'ten'", "limit")
    assert _error({"limit": ""}) == ("'limit' must be an integer, got ''", "limit")
    message, param = _error({"status": "finished"})
    assert (
        param == "status"
        and message.startswith("'status' must be one of 'running', 'done', ")
        and "finished" in message
    )
    message, param = _error({"after": "a..b"})
    assert param == "after" and message.startswith("'after': invalid job id 'a..b'")


def test_newest_first_by_submission_ties_by_id_whatever_the_bucket_s_order():
    states = [_job("old", 1.0), _job("b", 5.0), _job("a", 5.0), _job("new", 9.0), _job("unknown-time", None)]
    for seed in range(5):
        random.Random(seed).shuffle(states)
        assert _page(states, JobListQuery()) == (["new", "b", "a", "old", "unknown-time"], False)


def test_limit_one_walks_every_job_once_with_has_more_until_the_last():
    states = [_job(f"j{i:02d}", float(i // 3)) for i in range(10)]  # ties three by three
    expected = [s.job for s in sorted(states, key=place_of, reverse=True)]
    for limit in (1, 3, 10, 100):
        walked, after, more = [], None, True
        while more:
            page, more = _page(states, JobListQuery(limit=limit), after=after)
            assert len(page) == min(limit, len(expected) - len(walked)) and page
            walked += page
            after = place_of(next(s for s in states if s.job == page[-1]))
        assert walked == expected, limit


def test_after_the_last_job_the_page_is_empty():
    states = [_job("only", 1.0)]
    assert _page(states, JobListQuery(), after=place_of(states[0])) == ([], False)
    assert _page([], JobListQuery()) == ([], False)


def test_status_keeps_one_state_s_jobs():
    states = [_job("r1", 1.0, status="running"), _job("d1", 2.0), _job("r2", 3.0, status="running")]
    assert _page(states, JobListQuery(status="running")) == (["r2", "r1"], False)
    assert _page(states, JobListQuery(status="cancelled")) == ([], False)


def test_a_key_lists_its_own_jobs_an_operator_all_an_open_gateway_all():
    states = [_job("a1", 1.0, "a"), _job("b1", 2.0, "b"), _job("a2", 3.0, "a"), _job("keyless", 4.0)]
    owners = JobOwners(True, ("op",))
    seen = {}
    try:
        for key in ("a", "b", "op", None):
            bind_key(key)
            seen[key] = _page(states, JobListQuery(), owners.sees_owner)[0]
    finally:
        bind_key(None)
    assert seen == {"a": ["a2", "a1"], "b": ["b1"], "op": ["keyless", "a2", "b1", "a1"], None: []}
    assert _page(states, JobListQuery(), JobOwners(False, ()).sees_owner)[0] == ["keyless", "a2", "b1", "a1"]
    # a page is the caller's newest limit, not the newest limit of all with the others' dropped
    bind_key("a")
    try:
        assert _page(states, JobListQuery(limit=1), owners.sees_owner) == (["a2"], True)
    finally:
        bind_key(None)


def test_records_that_name_no_submitted_job_are_not_listed():
    counted_only = JobState("counted", done=3)  # a batch counted for a job no one submitted
    extra = [("not-json", b"{"), ("foreign", orjson.dumps({"job": "foreign", "documents": 1, "colour": "red"}))]
    assert _page([_job("real", 1.0), counted_only], JobListQuery(), extra=extra) == (["real"], False)


def test_a_page_answer_is_openai_s_list():
    assert page_answer([], False) == {
        "object": "list",
        "data": [],
        "first_id": None,
        "last_id": None,
        "has_more": False,
    }
    answer = page_answer([{"id": "x"}, {"id": "y"}], True)
    assert (answer["first_id"], answer["last_id"], answer["has_more"]) == ("x", "y", True)


def test_the_route_s_reading_on_a_real_bucket_its_cursor_and_its_bound(nats_url, monkeypatch):
    """JobsApi.page over a real nats-server: a key's page, a cursor of another key's job refused as one
    of no job, and a bucket past MAX_LISTED refused (503) with what to do."""
    from embedfleet.services.gateway.jobs import api as jobs_api
    from embedfleet.services.gateway.jobs import listing as job_list

    async def main() -> None:
        nc = await nats.connect(nats_url)
        try:
            js, subjects = nc.jetstream(), Subjects(f"t{uuid.uuid4().hex[:8]}")
            kv = await ensure_streams(js, subjects)
            for job, key, started in (("a1", "a", 1.0), ("b1", "b", 2.0), ("a2", "a", 3.0)):
                await make_claim(js, subjects, "gateway", job, owner_digest(key))  # as the gateway claims a job
                await update_state(kv, job, submitted(1, started=started, owner=owner_digest(key), status="done"))
            api = jobs_api.JobsApi(js, kv, subjects, None, owners=JobOwners(True, ()))
            bind_key("a")
            answer = await api.page(JobListQuery())
            assert [j["id"] for j in answer["data"]] == ["a2", "a1"] and "owner" not in answer["data"][0]
            assert [j["id"] for j in (await api.page(JobListQuery(after="a2")))["data"]] == ["a1"]
            refusals = []
            for after in ("b1", "nope"):
                with pytest.raises(ApiError) as caught:
                    await api.page(JobListQuery(after=after))
                refusals.append((caught.value.status, caught.value.message.replace(after, "X"), caught.value.param))
            assert refusals[0] == refusals[1] == (400, "'after': no job 'X' to list after", "after")
            monkeypatch.setattr(job_list, "MAX_LISTED", 2)
            with pytest.raises(ApiError) as caught:
                await api.page(JobListQuery())
            assert caught.value.status == 503 and caught.value.message.startswith(
                "the job bucket holds 3 records, more than the 2 a listing reads: records expire after the --job-ttl"
            )
        finally:
            bind_key(None)
            await nc.close()

    asyncio.run(main())
