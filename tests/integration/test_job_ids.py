"""A job id names one job, on the real stack: ids that differ only in '.', '/', '=' or '_' are jobs of
their own (their results never mix), ids that cannot name a job are refused at once, and an id that
exists answers the same request again with its state and any other with a conflict."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import numpy as np
import orjson
import pytest

from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import mixed_texts
from tests.support.procs import cli, post
from tests.support.procs import job_finished as _finished

pytestmark = pytest.mark.integration


def _submit_job(base_url: str, job: str, ids: list[str], texts: list[str], **fields) -> httpx.Response:
    documents = [{"id": d, "text": t} for d, t in zip(ids, texts)]
    return post(base_url, "/v1/jobs", {"id": job, "documents": documents, **fields}, timeout=60)


def _results(base_url: str, job: str) -> dict[str, list[float]]:
    r = httpx.get(f"{base_url}/v1/jobs/{job}/results", timeout=60)
    assert r.status_code == 200, r.text
    return {line["id"]: line["vector"] for line in map(orjson.loads, r.content.splitlines())}


def test_ids_that_differ_in_dot_or_underscore_never_share_results(stack, reference, tmp_path):
    """An attacker's job `victim.job` with other texts under the same document ids, done first; then
    `reindex --job-id victim_job`: every vector it writes is the victim's own (before, all were the
    attacker's: both ids had one results subject and the collector kept the first row of each id)."""
    ids = [f"d{i}" for i in range(40)]
    theirs, ours = mixed_texts(80)[:40], mixed_texts(80)[40:]
    r = _submit_job(stack.base_url, "victim.job", ids, theirs, batch_size=16)
    assert r.status_code == 202, r.text
    assert _finished(stack.base_url, "victim.job")["status"] == "done"

    docs = tmp_path / "ours.jsonl"
    docs.write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in zip(ids, ours)))
    out = tmp_path / "ours.npy"
    run = cli(
        [
            "reindex",
            str(docs),
            "--out",
            str(out),
            "--nats",
            stack.nats_url,
            "--job-id",
            "victim_job",
            "--batch-size",
            "16",
            "--quiet",
            "--stall-timeout",
            "60",
        ]
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(out.with_suffix(".ids.json").read_text()) == ids
    assert cosines(np.load(out), reference.encode(ours)).min() >= COSINE_TOLERANCE
    # the reader of GET /v1/jobs/{id}/results keeps each job to its own rows too
    for job, texts in (("victim.job", theirs), ("victim_job", ours)):
        got = _results(stack.base_url, job)
        assert sorted(got) == sorted(ids)
        c = cosines(np.array([got[d] for d in ids]), reference.encode(texts))
        assert c.min() >= COSINE_TOLERANCE, (job, c.min())


def test_a_job_running_beside_its_alias_finishes(stack, tmp_path):
    """`reindex --job-id alias_one` while `alias.one` (the same 300 document ids) runs: both finish,
    each with its 300 documents counted once."""
    texts = mixed_texts(300)
    ids = [f"a{i}" for i in range(300)]
    docs = tmp_path / "alias.jsonl"
    docs.write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in zip(ids, texts)))
    out = tmp_path / "alias.npy"
    reindex = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "embedfleet.services.cli",
            "reindex",
            str(docs),
            "--out",
            str(out),
            "--nats",
            stack.nats_url,
            "--job-id",
            "alias_one",
            "--batch-size",
            "32",
            "--quiet",
            "--stall-timeout",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        r = _submit_job(stack.base_url, "alias.one", ids, list(reversed(texts)), batch_size=32)
        assert r.status_code == 202, r.text
        stdout, stderr = reindex.communicate(timeout=240)
    finally:
        reindex.kill()
    assert reindex.returncode == 0, stdout + stderr
    assert json.loads(out.with_suffix(".ids.json").read_text()) == ids
    for job in ("alias_one", "alias.one"):
        state = _finished(stack.base_url, job, 120)
        assert (state["status"], state["documents"], state["done"], state.get("failed", 0)) == ("done", 300, 300, 0), (
            state
        )


@pytest.mark.parametrize("job", ["a..b", ".a", "a.", "a b"])
def test_reindex_refuses_an_id_that_cannot_name_a_job_at_once(stack, tmp_path, job):
    docs = tmp_path / "one.jsonl"
    docs.write_text('{"id": "x", "text": "hello"}\n')
    started = time.monotonic()
    run = cli(
        ["reindex", str(docs), "--out", str(tmp_path / "o.npy"), "--nats", stack.nats_url, "--job-id", job], timeout=60
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert (
        f"--job-id: invalid job id {job!r}: at most 128 letters, digits and - _ = / ., with no empty part" in run.stderr
    )
    assert time.monotonic() - started < 20  # refused before it meets NATS, not after a request that never returns
    r = httpx.get(f"{stack.base_url}/v1/jobs/{job}", timeout=10)  # the gateway's words are the same
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == run.stderr.strip().split("--job-id: ", 1)[1]


def test_an_id_that_exists_takes_the_same_request_again_and_refuses_another(stack, tmp_path):
    """Before, a second POST with other documents was added to the job (documents 3, batches 3, done 4)."""
    ids, texts = ["r0", "r1"], ["first text", "second text"]
    first = _submit_job(stack.base_url, "resubmitted", ids, texts, batch_size=1)
    assert first.status_code == 202, first.text
    done = _finished(stack.base_url, "resubmitted")
    assert (done["documents"], done["batches"], done["done"]) == (2, 2, 2)

    again = _submit_job(stack.base_url, "resubmitted", ids, texts, batch_size=1)
    assert again.status_code == 200, again.text
    assert {k: again.json()[k] for k in ("id", "status", "documents", "batches", "done")} == {
        "id": "resubmitted",
        "status": "done",
        "documents": 2,
        "batches": 2,
        "done": 2,
    }
    assert "owner" not in again.json()

    other = _submit_job(stack.base_url, "resubmitted", ["r0", "r1", "r2"], [*texts, "a third"], batch_size=1)
    assert other.status_code == 409, other.text
    assert other.json()["error"]["code"] == "conflict" and other.json()["error"]["param"] == "id"
    assert other.json()["error"]["message"] == (
        "job resubmitted exists with other documents, model, batch size or "
        "options: give it another job id (the same request again resumes it)"
    )
    form = _submit_job(stack.base_url, "resubmitted", ids, texts, batch_size=1, embedding_type="int8")
    assert form.status_code == 409 and form.json()["error"]["code"] == "conflict", form.text
    # nothing was published: the state is as the first run left it
    state = httpx.get(f"{stack.base_url}/v1/jobs/resubmitted", timeout=10).json()
    assert (state["documents"], state["batches"], state["done"], state["status"]) == (2, 2, 2, "done")

    # reindex under that id with another input is refused before anything is published
    docs = tmp_path / "other.jsonl"
    docs.write_text('{"id": "r0", "text": "something else"}\n')
    run = cli(
        [
            "reindex",
            str(docs),
            "--out",
            str(tmp_path / "o.npy"),
            "--nats",
            stack.nats_url,
            "--job-id",
            "resubmitted",
            "--batch-size",
            "1",
        ]
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "job resubmitted exists with other documents, model, batch size or options" in run.stderr
    state = httpx.get(f"{stack.base_url}/v1/jobs/resubmitted", timeout=10).json()
    assert (state["documents"], state["batches"], state["done"]) == (2, 2, 2)
