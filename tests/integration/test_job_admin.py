"""Bulk jobs on the real stack, before and after they run: `reindex` and POST /v1/jobs refuse what
they can check before publishing anything (and publish nothing), `embedfleet jobs` shows progress,
`embedfleet jobs purge` removes a job's results and record (a running job only with --force)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import nats
import pytest

from embedfleet.shared.jobs.bucket import read_state, update_state
from embedfleet.shared.jobs.documents import job_id_for
from embedfleet.shared.jobs.state import JobState, Run
from embedfleet.shared.jobs.streams import stream_names
from embedfleet.shared.nats.subjects import Subjects
from tests.support.corpus import mixed_texts
from tests.support.job_states import submitted
from tests.support.procs import cli

pytestmark = pytest.mark.integration

SUBJECTS = Subjects("embedfleet")
MODEL = "all-MiniLM-L6-v2"


def _nats(url: str, body):
    async def main():
        nc = await nats.connect(url)
        try:
            return await body(nc.jetstream())
        finally:
            await nc.close()

    return asyncio.run(main())


def _published(url: str) -> tuple[int, set[str]]:
    """The jobs stream's last sequence (it moves with every batch published) and the job records."""

    async def body(js):
        from nats.js.errors import NoKeysError

        last = (await js.stream_info(stream_names(SUBJECTS)["jobs"])).state.last_seq
        kv = await js.key_value(stream_names(SUBJECTS)["kv"])
        keys: set[str] = set()
        for _ in range(3):  # nats-py says NoKeysError too when its watcher's wait runs out on a loaded machine
            try:
                keys = set(await kv.keys())
                break
            except NoKeysError:
                continue
        return last, keys

    return _nats(url, body)


def _results(url: str, job: str) -> int:
    async def body(js):
        subject = SUBJECTS.results(job)
        info = await js.stream_info(stream_names(SUBJECTS)["results"], subjects_filter=subject)
        return (info.state.subjects or {}).get(subject, 0)

    return _nats(url, body)


def _state(url: str, job: str) -> JobState | None:
    return _nats(url, lambda js: _read(js, job))


async def _read(js, job: str) -> JobState | None:
    return await read_state(await js.key_value(stream_names(SUBJECTS)["kv"]), job)


def _docs(folder: Path, n: int, prefix: str) -> Path:
    path = folder / f"{prefix}.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"{prefix}-{i}", "text": t}) + "\n" for i, t in enumerate(mixed_texts(n)))
    )
    return path


def test_reindex_refuses_what_it_can_check_and_publishes_nothing(stack, tmp_path):
    docs = _docs(tmp_path, 20, "pre")
    (tmp_path / "plain.txt").write_text("a file, not a folder")
    (tmp_path / "taken.npy").mkdir()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "one"}\n{"id": "b", "text": "two"}\n{"id": "c", "text": 3}\n')
    twice = tmp_path / "twice.jsonl"
    twice.write_text('{"id": "a", "text": "one"}\n{"id": "a", "text": "two"}\n')
    before = _published(stack.nats_url)
    cases = [
        (docs, tmp_path / "plain.txt" / "out" / "v.npy", f"{tmp_path / 'plain.txt'} is a file, not a folder"),
        (docs, tmp_path / "taken.npy", f"{tmp_path / 'taken.npy'} is a folder"),
        (
            docs,
            tmp_path / "v.csv",
            "dense vectors are written to .npy (with .ids.json beside it) or .parquet, not .csv",
        ),
        (bad, tmp_path / "v.npy", f'{bad}:3: "text" must be a string, not a number'),
        (twice, tmp_path / "v.npy", "document id 'a' appears more than once"),
    ]
    for source, out, message in cases:
        result = cli(["reindex", str(source), "--out", str(out), "--nats", stack.nats_url, "--quiet"], timeout=90)
        assert result.returncode == 2 and message in result.stderr, (out, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr and result.stdout == ""
    assert not (tmp_path / "plain.txt").is_dir() and (tmp_path / "plain.txt").read_text() == "a file, not a folder"
    after = _published(stack.nats_url)
    assert after == before  # no batch published, no job recorded
    assert job_id_for(docs, MODEL, 64) not in after[1] and job_id_for(bad, MODEL, 64) not in after[1]


def test_reindex_refuses_what_the_fleet_cannot_run_and_publishes_nothing(stack, tmp_path):
    """A model nobody serves and an output the model cannot make are found before publishing (from
    the fleet's discovery answers), not as dead letters after."""
    docs = _docs(tmp_path, 20, "fleet")
    before = _published(stack.nats_url)
    cases = [
        (
            ["--model", "no-such-model"],
            (
                "model 'no-such-model' is not served here (no live tokenizer and worker for it); "
                f"served: {MODEL}; nothing was published"
            ),
        ),
        (
            ["--model", f"sentence-transformers/{MODEL}"],
            (
                f"model 'sentence-transformers/{MODEL}' is not served here (no "
                f"live tokenizer and worker for it): name it '{MODEL}'"
            ),
        ),
        (["--output", "sparse"], f"{MODEL} makes no sparse vectors (it makes: dense); nothing was published"),
        (["--output", "multivector"], f"{MODEL} makes no multivector vectors (it makes: dense)"),
    ]
    for args, message in cases:
        out = tmp_path / ("v.npz" if "--output" in args else "v.npy")
        result = cli(["reindex", str(docs), "--out", str(out), "--nats", stack.nats_url, "--quiet", *args], timeout=90)
        assert result.returncode == 2 and f"embedfleet: error: {message}" in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr and result.stdout == ""
    assert _published(stack.nats_url) == before  # no batch published, no job recorded


def test_post_jobs_refuses_bad_documents_and_publishes_nothing(stack):
    before = _published(stack.nats_url)
    cases = [
        (
            {
                "documents": [{"id": "a", "text": "x"}, {"id": "b", "text": "y"}, {"id": "a", "text": "z"}],
                "id": "pre-http",
            },
            "document ids must be unique: 'documents[2]' repeats id 'a'",
            "documents",
        ),
        (
            {"documents": [{"id": "a", "text": "x"}, {"id": "b", "text": None}], "id": "pre-http"},
            "'documents[1].text' must be a string, got null",
            "documents.text",
        ),
        (
            {"documents": [{"id": "a", "text": "x"}], "path": "docs.jsonl", "id": "pre-http"},
            "give 'documents' or 'path', not both",
            "path",
        ),
    ]
    for body, message, param in cases:
        r = httpx.post(f"{stack.base_url}/v1/jobs", json=body, timeout=30)
        assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
        assert r.json()["error"]["param"] == param
    assert _published(stack.nats_url) == before
    assert _state(stack.nats_url, "pre-http") is None


def test_post_jobs_refuses_what_the_fleet_cannot_run_and_publishes_nothing(stack):
    before = _published(stack.nats_url)
    docs = [{"id": "a", "text": "x"}]
    cases = [
        ({"model": "no-such-model"}, 404, "model_not_found", "model 'no-such-model' is not served here", "model"),
        ({"output": "sparse"}, 400, "invalid_request", f"{MODEL} makes no sparse vectors", "output"),
        ({"output": "multivector"}, 400, "invalid_request", f"{MODEL} makes no multivector vectors", "output"),
    ]
    for fields, status, code, message, param in cases:
        r = httpx.post(f"{stack.base_url}/v1/jobs", json={"documents": docs, "id": "fleet-http", **fields}, timeout=30)
        assert r.status_code == status and r.json()["error"]["code"] == code, r.text
        assert message in r.json()["error"]["message"] and r.json()["error"]["param"] == param, r.text
    assert _published(stack.nats_url) == before
    assert _state(stack.nats_url, "fleet-http") is None


def test_jobs_lists_progress_and_purge_removes_results_and_record(stack, tmp_path):
    docs = _docs(tmp_path, 40, "purge")
    out = tmp_path / "v.npy"
    common = ["--nats", stack.nats_url, "--batch-size", "16", "--quiet", "--stall-timeout", "30"]
    run = cli(["reindex", str(docs), "--out", str(out), *common], timeout=90)
    assert run.returncode == 0, run.stdout + run.stderr
    job = run.stdout.split()[1].rstrip(":")

    # a job that runs: 3 of 10 documents settled in the 10 s since it started
    started = time.time() - 10
    _nats(stack.nats_url, lambda js: _running(js, started))
    asked = time.time()
    listing = cli(["jobs", "--nats", stack.nats_url], timeout=90)
    answered = time.time()
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[0]: line.split() for line in listing.stdout.splitlines()[1:]}
    status, documents, done, failed, share, docs_s, tokens_s, eta = rows[job][1:9]
    assert (status, documents, done, failed, share, eta) == ("done", "40", "40", "0", "100.0%", "-")
    assert float(docs_s) > 0 and float(tokens_s.replace(",", "")) > 0
    status, documents, done, failed, share, docs_s, _, eta = rows["admin-running"][1:9]
    assert (status, documents, done, failed, share) == ("running", "10", "2", "1", "30.0%")
    # 2 documents embedded (1 given up: not in the rate) in the ~10 s since it started, 7 left at 3
    # settled in that time; the seconds are those between the job's start and the listing's reading
    low, high = asked - started, answered - started
    assert 2 / high - 0.05 <= float(docs_s) <= 2 / low + 0.05, (docs_s, low, high)
    assert re.fullmatch(r"\d+s", eta) and 7 * low / 3 - 1 <= int(eta[:-1]) <= 7 * high / 3 + 1, (eta, low, high)

    refused = cli(["jobs", "purge", "admin-running", "--nats", stack.nats_url], timeout=90)
    assert refused.returncode == 2 and "job admin-running is running (3/10 documents)" in refused.stderr
    assert "--force" in refused.stderr
    assert _results(stack.nats_url, "admin-running") == 1 and _state(stack.nats_url, "admin-running") is not None
    forced = cli(["jobs", "purge", "admin-running", "--force", "--nats", stack.nats_url], timeout=90)
    assert forced.returncode == 0, forced.stderr
    assert _results(stack.nats_url, "admin-running") == 0 and _state(stack.nats_url, "admin-running") is None

    # results gone while the record stays (as when they expire): a rerun is refused, not left to stall
    assert _results(stack.nats_url, job) > 0
    _nats(stack.nats_url, lambda js: js.purge_stream(stream_names(SUBJECTS)["results"], subject=SUBJECTS.results(job)))
    again = cli(["reindex", str(docs), "--out", str(out), *common], timeout=90)
    assert again.returncode == 2 and f"job {job} stored 40 documents' vectors" in again.stderr, again.stderr
    assert f"embedfleet jobs purge {job}" in again.stderr

    purged = cli(["jobs", "purge", job, "--nats", stack.nats_url], timeout=90)
    assert purged.returncode == 0 and purged.stdout.startswith(f"job {job}: 0 result messages"), purged.stdout
    assert _state(stack.nats_url, job) is None
    assert job not in cli(["jobs", "--nats", stack.nats_url], timeout=90).stdout
    nothing = cli(["jobs", "purge", job, "--nats", stack.nats_url], timeout=90)
    assert nothing.returncode == 1 and f"no job {job}" in nothing.stdout

    # run again at once, its batches would be dropped as repeats of the purged run's: refused, not left to stall
    before = _published(stack.nats_url)
    soon = cli(["reindex", str(docs), "--out", str(out), *common], timeout=90)
    assert soon.returncode == 2 and f"job {job} was purged less than 600s ago" in soon.stderr, soon.stdout + soon.stderr
    assert _published(stack.nats_url) == before
    r = httpx.post(f"{stack.base_url}/v1/jobs", json={"documents": [{"id": "a", "text": "x"}], "id": job}, timeout=30)
    assert r.status_code == 400 and "was purged less than 600s ago" in r.json()["error"]["message"], r.text
    assert _published(stack.nats_url) == before


async def _running(js, started: float) -> None:
    kv = await js.key_value(stream_names(SUBJECTS)["kv"])
    await update_state(
        kv,
        "admin-running",
        submitted(
            10,
            model=MODEL,
            batches=1,
            published=1,
            done=2,
            failed=1,
            tokens=40,
            status="running",
            started=started,
            run=Run(started, 0, 0, 0),
        ),
    )
    await js.publish(SUBJECTS.results("admin-running"), b"not read", headers={"Nats-Msg-Id": "admin-running:0:0"})


def test_init_sets_the_retention_given_by_flag_or_environment_and_keeps_it_otherwise(nats_url):
    import os

    prefix = ["--nats", nats_url, "--subject-prefix", "retcheck"]
    names = stream_names(Subjects("retcheck"))

    def limits() -> tuple:
        async def body(js):
            results = (await js.stream_info(names["results"])).config
            bucket = (await js.stream_info(f"KV_{names['kv']}")).config
            return results.max_age, results.max_bytes, bucket.max_age, bucket.max_msgs_per_subject

        return _nats(nats_url, body)

    given = cli(
        [
            "init",
            *prefix,
            "--results-max-age",
            "3600",
            "--results-max-bytes",
            "1000000",
            "--job-ttl",
            "7200",
            "--job-history",
            "4",
        ],
        timeout=90,
    )
    assert given.returncode == 0, given.stderr
    assert "results: max age 3600s, max bytes 1000000; job records: ttl 7200s, history 4" in given.stdout
    assert limits() == (3600, 1_000_000, 7200, 4)
    assert cli(["init", *prefix], timeout=90).returncode == 0
    assert limits() == (3600, 1_000_000, 7200, 4)  # none given: none changed
    env = {**os.environ, "EMBEDFLEET_RESULTS_MAX_AGE": "120", "EMBEDFLEET_JOB_HISTORY": "2"}
    by_env = subprocess.run(
        [sys.executable, "-m", "embedfleet.services.cli", "init", *prefix],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert by_env.returncode == 0, by_env.stderr
    assert limits() == (120, 1_000_000, 7200, 2)
    bad = cli(["init", *prefix, "--job-history", "100"], timeout=90)
    assert bad.returncode == 2 and "--job-history 100: must be in 1..64" in bad.stderr and "Traceback" not in bad.stderr
