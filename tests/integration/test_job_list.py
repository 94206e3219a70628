"""GET /v1/jobs on the real stack, through a gateway with two API keys and an operator key beside the
stack's open one: each key lists exactly its own jobs, newest first, each as GET /v1/jobs/{id}
answers it; the operator key and the open gateway list every job; limit=1 walks a key's jobs a page
at a time; a bad limit, status or cursor is a 400 in the route's error shape; the example of docs/bulk-jobs.md runs."""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from embedfleet.services.gateway.jobs.answers import JobList
from embedfleet.services.gateway.response_parts import OpenAIError
from tests.support.procs import another_gateway, job_finished

pytestmark = pytest.mark.integration

KEYS = {"a": "list-key-a", "b": "list-key-b", "op": "list-key-op"}


def _headers(key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[key]}"} if key else {}


@pytest.fixture(scope="module")
def keyed(stack, tmp_path_factory) -> Iterator[str]:
    """The base URL of a gateway with keys a and b and the operator key, on the stack's NATS."""
    args = ["--api-keys", f"{KEYS['a']},{KEYS['b']}", "--operator-keys", KEYS["op"]]
    yield from another_gateway(stack.nats_url, args, tmp_path_factory.mktemp("logs"), "a gateway with API keys")


@pytest.fixture(scope="module")
def jobs(stack, keyed) -> dict[str | None, list[str]]:
    """Jobs made one after another by key a (3), key b (2) and without a key on the open gateway (1),
    all finished: their ids by who made them ("all": every one), oldest first."""
    run = uuid.uuid4().hex[:6]
    made: dict[str | None, list[str]] = {"a": [], "b": [], None: [], "all": []}
    for key, n in (("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), (None, 0)):
        job = f"list-{run}-{key or 'open'}-{n}"
        base = keyed if key else stack.base_url
        body = {"id": job, "documents": [{"id": "d", "text": f"listed job {job}"}]}
        r = httpx.post(f"{base}/v1/jobs", json=body, headers=_headers(key), timeout=60)
        assert r.status_code == 202, r.text
        made[key].append(job)
        made["all"].append(job)
    for job in made["all"]:
        job_finished(stack.base_url, job)  # the open gateway sees every job
    return made


def _page(base: str, key: str | None, **params) -> dict:
    r = httpx.get(f"{base}/v1/jobs", params=params, headers=_headers(key), timeout=60)
    assert r.status_code == 200, r.text
    JobList.model_validate_json(r.content)  # the route's answer is its documented model
    return r.json()


def _every(base: str, key: str | None, limit: int = 100) -> list[dict]:
    """Every job the caller may see, page after page."""
    seen, after = [], None
    while True:
        page = _page(base, key, limit=limit, **({"after": after} if after else {}))
        seen += page["data"]
        if not page["has_more"]:
            return seen
        after = page["last_id"]


def test_a_key_lists_its_own_jobs_newest_first_each_as_its_state(keyed, jobs):
    for key in ("a", "b"):
        page = _page(keyed, key)
        ids = [j["id"] for j in page["data"]]
        assert ids == jobs[key][::-1], (key, ids)  # its own alone, not the other key's nor the keyless one
        assert (page["first_id"], page["last_id"], page["has_more"]) == (ids[0], ids[-1], False)
        for job in page["data"]:
            state = httpx.get(f"{keyed}/v1/jobs/{job['id']}", headers=_headers(key), timeout=10).json()
            assert job == state
        assert [j["id"] for j in _page(keyed, key, status="done")["data"]] == ids
        assert _page(keyed, key, status="running")["data"] == []


def test_the_operator_key_and_the_open_gateway_list_every_job(stack, keyed, jobs):
    operator = [j["id"] for j in _every(keyed, "op")]
    everyone = [j["id"] for j in _every(stack.base_url, None, limit=4)]  # pages of 4
    assert operator == everyone and len(set(operator)) == len(operator)
    # the stack's other jobs among them; these newest first: the order they were made in, reversed
    assert [job for job in operator if job in jobs["all"]] == jobs["all"][::-1]


def test_limit_one_walks_a_key_s_jobs_with_has_more(keyed, jobs):
    walked, after, pages = [], None, []
    while after is None or pages[-1]["has_more"]:
        page = _page(keyed, "a", limit=1, **({"after": after} if after else {}))
        assert len(page["data"]) == 1 and page["first_id"] == page["last_id"] == page["data"][0]["id"]
        pages.append(page)
        walked.append(page["last_id"])
        after = page["last_id"]
    assert walked == jobs["a"][::-1] and [p["has_more"] for p in pages] == [True, True, False]


def test_a_bad_query_is_a_400_in_the_route_s_shape(keyed, jobs):
    def refused(key: str, **params) -> dict:
        r = httpx.get(f"{keyed}/v1/jobs", params=params, headers=_headers(key), timeout=30)
        assert r.status_code == 400, (params, r.text)
        OpenAIError.model_validate_json(r.content)
        error = r.json()["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_request"), error
        return error

    assert refused("a", limit=0)["param"] == "limit"
    assert refused("a", limit=101) == {
        "message": "'limit' must be at most 100, got '101'",
        "type": "invalid_request_error",
        "param": "limit",
        "code": "invalid_request",
    }
    assert refused("a", limit="many")["message"] == "'limit' must be an integer, got 'many'"
    assert refused("a", status="finished")["param"] == "status"
    assert refused("a", after="a..b")["param"] == "after"
    # another key's job places no cursor, exactly as a job that is not there: nothing of it is told
    theirs, none = refused("a", after=jobs["b"][0]), refused("a", after="no-such-job")
    assert theirs == {**none, "message": none["message"].replace("no-such-job", jobs["b"][0])}
    assert httpx.get(f"{keyed}/v1/jobs", timeout=30).status_code == 401  # no key


def test_the_docs_example_runs_as_typed(keyed, jobs):
    """docs/bulk-jobs.md's curl, its host and key swapped for this gateway's and key a: key a's two newest
    done jobs, and that more follow."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "bulk-jobs.md").read_text()
    (command,) = re.findall(r"^ *(curl -s 'localhost:8080/v1/jobs\?.*)$", page, re.M)
    command = command.replace("localhost:8080", keyed.removeprefix("http://")).replace("KEY", KEYS["a"])
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    page = JobList.model_validate_json(done.stdout)
    assert [job.id for job in page.data] == jobs["a"][:0:-1] and page.has_more
    assert {job.status for job in page.data} == {"done"}
