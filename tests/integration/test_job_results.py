"""A job's vectors read back on the real stack: GET /v1/jobs/{id}/results (NDJSON and Parquet, streamed)
and `embedfleet jobs fetch`, against the reference model, against each other and against what
`embedfleet reindex` writes for the same job; the route's refusals; the example docs/bulk-jobs.md gives."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from embedfleet.services.gateway.jobs.answers import JobResultLine, JobSubmitted
from embedfleet.shared.nats.server import free_port
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import mixed_texts
from tests.support.procs import Service, cli, healthy, wait_until
from tests.support.procs import job_finished as _finished

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PARQUET = "application/vnd.apache.parquet"


def _submit(base_url: str, job: str, texts: list[str], **fields) -> list[str]:
    """POST a job of ``texts`` (ids ``<job>-<i>``), wait until it is done; its ids in input order."""
    ids = [f"{job}-{i}" for i in range(len(texts))]
    r = httpx.post(
        f"{base_url}/v1/jobs",
        json={"id": job, "documents": [{"id": d, "text": t} for d, t in zip(ids, texts)], **fields},
        timeout=60,
    )
    assert r.status_code == 202, r.text
    JobSubmitted.model_validate_json(r.content)  # the answer is its documented model, strictly
    state = _finished(base_url, job)
    assert state["status"] == "done" and state["done"] == len(texts), state
    return ids


def _lines(r: httpx.Response) -> dict[str, list]:
    """NDJSON: id -> vector, every id once."""
    raw = r.content.splitlines()
    for line in raw:
        JobResultLine.model_validate_json(line)  # each line is its documented model, strictly
    lines = [orjson.loads(line) for line in raw]
    assert all(set(line) == {"id", "vector"} for line in lines), lines[:2]
    vectors = {line["id"]: line["vector"] for line in lines}
    assert len(vectors) == len(lines)
    return vectors


@pytest.fixture(scope="module")
def float_job(stack) -> tuple[str, list[str], list[str]]:
    """A float32 job of 40 documents in 3 batches, submitted over HTTP and done: (job, ids, texts)."""
    texts = mixed_texts(40)
    return "results-float", _submit(stack.base_url, "results-float", texts, batch_size=16), texts


def test_results_stream_as_ndjson_with_the_reference_vectors(stack, reference, float_job):
    job, ids, texts = float_job
    with httpx.stream("GET", f"{stack.base_url}/v1/jobs/{job}/results", timeout=60) as r:  # httpx sends Accept: */*
        body = b"".join(r.iter_bytes())
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    # streamed: sent in chunks as read, no length known before the end
    assert r.headers.get("transfer-encoding") == "chunked" and "content-length" not in r.headers
    assert {
        k: r.headers[k]
        for k in ("x-job-status", "x-job-documents", "x-job-done", "x-job-failed", "x-embedding-type", "x-job-output")
    } == {
        "x-job-status": "done",
        "x-job-documents": "40",
        "x-job-done": "40",
        "x-job-failed": "0",
        "x-embedding-type": "float32",
        "x-job-output": "dense",
    }
    vectors = _lines(httpx.Response(200, content=body))
    assert sorted(vectors) == sorted(ids)
    rows = np.array([vectors[d] for d in ids], dtype=np.float32)
    assert rows.shape == (40, 384)
    c = cosines(rows, reference.encode(texts))
    assert c.min() >= COSINE_TOLERANCE, c.min()
    named = httpx.get(f"{stack.base_url}/v1/jobs/{job}/results", headers={"accept": "application/x-ndjson"}, timeout=60)
    assert named.status_code == 200 and _lines(named) == vectors


def test_parquet_and_jobs_fetch_hold_the_same_vectors(stack, float_job, tmp_path):
    job, ids, _ = float_job
    vectors = _lines(httpx.get(f"{stack.base_url}/v1/jobs/{job}/results", timeout=60))
    rows = np.array([vectors[d] for d in ids], dtype=np.float32)  # float32 written as decimals that read back exactly
    for media in (PARQUET, "application/x-parquet"):
        r = httpx.get(f"{stack.base_url}/v1/jobs/{job}/results", headers={"accept": media}, timeout=60)
        assert r.status_code == 200 and r.headers["content-type"] == PARQUET, r.text[:300]
        table = pq.read_table(io.BytesIO(r.content))
        assert table.column_names == ["id", "vector"]
        assert (table.schema.metadata[b"embedding_type"], table.schema.metadata[b"dim"]) == (b"float32", b"384")
        got = dict(zip(table.column("id").to_pylist(), table.column("vector").to_numpy(zero_copy_only=False)))
        assert sorted(got) == sorted(ids)
        np.testing.assert_array_equal(np.stack([got[d] for d in ids]), rows)

    fetched = cli(
        ["jobs", "fetch", job, "--out", str(tmp_path / "v.npy"), "--nats", stack.nats_url], timeout=90, cwd=ROOT
    )
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert fetched.stdout == f"job {job}: 40 of 40 documents, float32 vectors -> {tmp_path / 'v.npy'}\n"
    assert json.loads((tmp_path / "v.ids.json").read_text()) == ids  # input order
    np.testing.assert_array_equal(np.load(tmp_path / "v.npy"), rows)
    fetched = cli(
        ["jobs", "fetch", job, "--out", str(tmp_path / "v.parquet"), "--nats", stack.nats_url], timeout=90, cwd=ROOT
    )
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    table = pq.read_table(tmp_path / "v.parquet")
    assert table.column("id").to_pylist() == ids and table.schema.metadata[b"dim"] == b"384"
    np.testing.assert_array_equal(np.stack(table.column("vector").to_numpy(zero_copy_only=False)), rows)


def test_a_quantized_job_reads_as_reindex_writes_it(stack, tmp_path):
    """An int8 job over HTTP: its NDJSON rows are integers, and `jobs fetch` writes them; `reindex` does
    not take that job over (only the way a job was made resumes it: the job's batches are signed with a
    secret its maker's role alone reads), saying so; and for a job of its own, `jobs fetch` writes the
    very file `reindex` wrote."""
    texts = mixed_texts(24)
    ids = _submit(stack.base_url, "results-int8", texts, batch_size=8, embedding_type="int8")
    vectors = _lines(httpx.get(f"{stack.base_url}/v1/jobs/results-int8/results", timeout=60))
    assert all(isinstance(x, int) and -127 <= x <= 127 for v in vectors.values() for x in v)
    fetched = cli(
        ["jobs", "fetch", "results-int8", "--out", str(tmp_path / "http.npy"), "--nats", stack.nats_url],
        timeout=90,
        cwd=ROOT,
    )
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    read = np.load(tmp_path / "http.npy")
    assert read.dtype == np.int8 and read.shape == (24, 384)
    np.testing.assert_array_equal(np.array([vectors[d] for d in ids], dtype=np.int8), read)

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in zip(ids, texts)))

    def reindex(job: str) -> subprocess.CompletedProcess:
        out = ["--out", str(tmp_path / "reindex.npy"), "--job-id", job, "--batch-size", "8"]
        quiet = ["--quiet", "--stall-timeout", "30"]
        return cli(
            ["reindex", str(docs), *out, "--embedding-type", "int8", "--nats", stack.nats_url, *quiet],
            timeout=90,
            cwd=ROOT,
        )

    taken = reindex("results-int8")
    assert taken.returncode == 2 and "submitted another way" in taken.stderr, taken.stdout + taken.stderr
    assert "Traceback" not in taken.stderr
    rerun = reindex("results-int8-cli")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    fetched = cli(
        ["jobs", "fetch", "results-int8-cli", "--out", str(tmp_path / "fetch.npy"), "--nats", stack.nats_url],
        timeout=90,
        cwd=ROOT,
    )
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    written, read = np.load(tmp_path / "reindex.npy"), np.load(tmp_path / "fetch.npy")
    assert written.dtype == read.dtype == np.int8 and written.shape == (24, 384)
    np.testing.assert_array_equal(read, written)
    assert (tmp_path / "fetch.ids.json").read_text() == (tmp_path / "reindex.ids.json").read_text()


def _record(stack, job: str, **state) -> None:
    """A job's record as a publisher writes it, with no batch published: its state is all there is."""
    import nats

    from embedfleet.shared.jobs.bucket import update_state
    from embedfleet.shared.jobs.streams import ensure_streams
    from embedfleet.shared.nats.subjects import Subjects
    from tests.support.job_states import submitted

    async def main() -> None:
        nc = await nats.connect(stack.nats_url)
        try:
            kv = await ensure_streams(nc.jetstream(), Subjects("embedfleet"))
            await update_state(kv, job, submitted(model="all-MiniLM-L6-v2", **state))
        finally:
            await nc.close()

    asyncio.run(main())


def test_refusals(stack, float_job, tmp_path):
    base, out = stack.base_url, str(tmp_path / "x.npy")
    missing = httpx.get(f"{base}/v1/jobs/nope/results", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"] == {
        "message": "no job 'nope'",
        "type": "invalid_request_error",
        "param": "id",
        "code": "not_found",
    }
    fetched = cli(["jobs", "fetch", "nope", "--out", out, "--nats", stack.nats_url], timeout=90, cwd=ROOT)
    assert fetched.returncode == 2 and fetched.stderr == "embedfleet: error: no job 'nope'\n"

    wrong = cli(
        ["jobs", "fetch", float_job[0], "--out", str(tmp_path / "x.npz"), "--nats", stack.nats_url],
        timeout=90,
        cwd=ROOT,
    )
    assert wrong.returncode == 2 and "dense vectors are written to .npy" in wrong.stderr, wrong.stderr

    refused = httpx.get(f"{base}/v1/jobs/{float_job[0]}/results", headers={"accept": "application/json"}, timeout=10)
    assert refused.status_code == 406 and refused.json()["error"]["code"] == "not_acceptable", refused.text
    assert refused.json()["error"]["param"] == "accept" and PARQUET in refused.json()["error"]["message"]

    _record(stack, "results-running", documents=6, batches=2, published=1, done=2, status="running")
    early = httpx.get(f"{base}/v1/jobs/results-running/results", timeout=10)
    said = "job results-running is running: 2 of 6 documents settled; its results can be read once it is done"
    assert early.status_code == 409 and early.json()["error"]["message"] == said, early.text
    assert early.json()["error"]["code"] == "not_finished"
    fetched = cli(["jobs", "fetch", "results-running", "--out", out, "--nats", stack.nats_url], timeout=90, cwd=ROOT)
    assert fetched.returncode == 2 and said in fetched.stderr, fetched.stderr

    _record(stack, "results-expired", documents=5, batches=1, published=1, done=5, status="done")
    gone = httpx.get(f"{base}/v1/jobs/results-expired/results", timeout=10)
    assert gone.status_code == 410 and gone.json()["error"]["code"] == "gone", gone.text
    assert "holds none of them any more" in gone.json()["error"]["message"]
    fetched = cli(["jobs", "fetch", "results-expired", "--out", out, "--nats", stack.nats_url], timeout=90, cwd=ROOT)
    assert fetched.returncode == 2 and "holds none of them any more" in fetched.stderr, fetched.stderr
    assert not (tmp_path / "x.npy").exists()


def test_a_job_with_documents_given_up_gives_what_it_stored(stack, tmp_path):
    """One batch of three documents stored, one given up by the tokenizer (a text that is no text):
    the route streams the three, its headers say three failed; `jobs fetch` writes them and exits 1."""
    import msgpack
    import nats

    from embedfleet.shared.jobs.bucket import update_state
    from embedfleet.shared.jobs.claims import make_claim
    from embedfleet.shared.jobs.streams import ensure_streams
    from embedfleet.shared.nats.subjects import Subjects
    from embedfleet.shared.protocol import EmbedOptions, JobBatch, encode
    from tests.support.job_states import submitted
    from tests.support.procs import job_settled

    subjects, model, job = Subjects("embedfleet"), "all-MiniLM-L6-v2", "results-partial"

    async def main() -> dict:
        nc = await nats.connect(stack.nats_url)
        js = nc.jetstream()
        kv = await ensure_streams(js, subjects)
        await update_state(kv, job, submitted(6, model=model, batches=2, status="running"))
        good = JobBatch(job, 0, model, ["a", "b", "c"], ["one", "two", "three"], EmbedOptions())
        claim = await make_claim(js, subjects, "gateway", job, None)  # its batches signed, as a gateway's
        await js.publish(
            subjects.jobs(model), encode(good), headers={"Nats-Msg-Id": f"{job}:0", **claim.sign(encode(good))}
        )
        bad = msgpack.packb(
            {
                "v": 2,
                "t": "job",
                "jb": job,
                "bi": 1,
                "m": model,
                "di": ["d", "e", "f"],
                "x": ["four", 5, "six"],
                "o": {},
            }
        )
        await js.publish(subjects.jobs(model), bad, headers={"Nats-Msg-Id": f"{job}:1", **claim.sign(bad)})
        state = await job_settled(kv, job)
        await nc.close()
        return state

    assert asyncio.run(main())["status"] == "done_with_errors"
    r = httpx.get(f"{stack.base_url}/v1/jobs/{job}/results", timeout=30)
    assert r.status_code == 200 and (r.headers["x-job-status"], r.headers["x-job-failed"]) == ("done_with_errors", "3")
    assert sorted(_lines(r)) == ["a", "b", "c"]
    fetched = cli(
        ["jobs", "fetch", job, "--out", str(tmp_path / "p.npy"), "--nats", stack.nats_url], timeout=90, cwd=ROOT
    )
    assert fetched.returncode == 1, fetched.stdout + fetched.stderr
    assert "3 of 6 documents" in fetched.stdout and "3 missing: 3 were given up" in fetched.stdout
    assert json.loads((tmp_path / "p.ids.json").read_text()) == ["a", "b", "c"]


def test_results_need_an_api_key_where_the_gateway_asks_for_one(stack, float_job, tmp_path):
    """A job made without a key (here on the open gateway) is read with an operator key; to the other
    keys it is as if it did not exist."""
    port = free_port()
    gateway = Service(
        "gateway",
        ["--nats", stack.nats_url, "--port", str(port), "--api-keys", "key-one", "--operator-keys", "key-op"],
        tmp_path,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthy(base), 60, "a gateway with API keys", [gateway])
        url = f"{base}/v1/jobs/{float_job[0]}/results"
        denied = httpx.get(url, timeout=10)
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "unauthorized"
        hidden = httpx.get(url, headers={"authorization": "Bearer key-one"}, timeout=60)
        assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "not_found", hidden.text
        allowed = httpx.get(url, headers={"authorization": "Bearer key-op"}, timeout=60)
        assert allowed.status_code == 200 and len(_lines(allowed)) == 40
    finally:
        gateway.stop()


def test_the_docs_example_runs_as_typed(stack, tmp_path):
    """docs/bulk-jobs.md's example of reading a job's vectors, typed into a shell against this stack
    (its gateway's address for 127.0.0.1:8080, its NATS server given by the environment)."""
    text = (ROOT / "docs" / "bulk-jobs.md").read_text()
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "first-job/results" in b]
    script = block.replace("http://127.0.0.1:8080", stack.base_url)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "EMBEDFLEET_NATS_URL": stack.nats_url,
        "PYTHONPATH": str(ROOT),
    }  # this checkout's embedfleet
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    answers = [orjson.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    lines = [a for a in answers if "vector" in a]  # the results' lines, after the POST's answer
    assert sorted(line["id"] for line in lines) == ["a", "b"] and all(len(line["vector"]) == 384 for line in lines)
    table = pq.read_table(tmp_path / "first-job.parquet")
    assert sorted(table.column("id").to_pylist()) == ["a", "b"]
    assert json.loads((tmp_path / "first-job.ids.json").read_text()) == ["a", "b"]
    assert np.load(tmp_path / "first-job.npy").shape == (2, 384)


def test_stored_order_is_streamed_and_input_order_is_fetched(stack, tmp_path):
    """Results a NATS client stored last batch first, one part twice (as after the stream's duplicate
    window) and one of another form: the route streams each document once in the order stored,
    leaves the foreign rows out, and `jobs fetch` writes input order."""
    import nats

    from embedfleet.shared.jobs.streams import ensure_streams, stream_names
    from embedfleet.shared.nats.subjects import Subjects
    from embedfleet.shared.protocol import JobResult, encode

    subjects, job = Subjects("embedfleet"), "results-order"
    rows = np.arange(6 * 4, dtype="<f4").reshape(6, 4) / 10

    def result(batch: int, dtype: str = "f4") -> bytes:
        part = rows[2 * batch : 2 * batch + 2]
        data = part.tobytes() if dtype == "f4" else part.astype("<f2").tobytes()
        return encode(JobResult(job, batch, 0, [f"o{2 * batch}", f"o{2 * batch + 1}"], 4, dtype, data, 3))

    async def store() -> int:
        nc = await nats.connect(stack.nats_url)
        try:
            js = nc.jetstream()
            await ensure_streams(js, subjects)
            for n, data in enumerate([result(2), result(1), result(1), result(0, "f2"), result(0)]):
                await js.publish(subjects.results(job), data, headers={"Nats-Msg-Id": f"{job}:{n}"})
            info = await js.stream_info(stream_names(subjects)["results"], subjects_filter=subjects.results(job))
            return info.state.subjects[subjects.results(job)]
        finally:
            await nc.close()

    assert asyncio.run(store()) == 5
    _record(stack, job, documents=6, batches=3, published=3, done=6, status="done", embedding_type="float32")
    r = httpx.get(f"{stack.base_url}/v1/jobs/{job}/results", timeout=30)
    assert r.status_code == 200, r.text
    lines = [orjson.loads(line) for line in r.content.splitlines()]
    assert [line["id"] for line in lines] == ["o4", "o5", "o2", "o3", "o0", "o1"]
    np.testing.assert_array_equal(np.array([line["vector"] for line in lines], dtype="<f4"), rows[[4, 5, 2, 3, 0, 1]])
    fetched = cli(
        ["jobs", "fetch", job, "--out", str(tmp_path / "o.npy"), "--nats", stack.nats_url], timeout=90, cwd=ROOT
    )
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert json.loads((tmp_path / "o.ids.json").read_text()) == [f"o{i}" for i in range(6)]
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), rows)
