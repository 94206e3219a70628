"""Bulk jobs through JetStream on the real stack: every document exactly once, vectors as the reference."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import mixed_texts

pytestmark = pytest.mark.integration


def _run(args: list[str], timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "embedfleet.services.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_reindex_jsonl_to_npy(stack, reference, tmp_path):
    texts = mixed_texts(300)
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"doc-{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "vectors.npy"
    result = _run(
        [
            "reindex",
            str(docs),
            "--out",
            str(out),
            "--nats",
            stack.nats_url,
            "--batch-size",
            "32",
            "--quiet",
            "--stall-timeout",
            "30",
        ]
    )
    logs = "\n".join(f"--- {n}\n{s.log()[-1500:]}" for n, s in stack.services.items() if n != "gateway")
    assert result.returncode == 0, result.stdout + result.stderr + logs
    assert "300 documents" in result.stdout
    ids = json.loads(out.with_suffix(".ids.json").read_text())
    assert ids == [f"doc-{i}" for i in range(300)]  # every document once, in input order
    vectors = np.load(out)
    assert vectors.shape == (300, 384)
    c = cosines(vectors, reference.encode(texts))
    assert c.min() >= COSINE_TOLERANCE, c.min()

    listing = _run(["jobs", "--nats", stack.nats_url])
    assert listing.returncode == 0
    job = result.stdout.split()[1].rstrip(":")
    row = next(line for line in listing.stdout.splitlines() if line.startswith(job))
    assert row.split()[1:5] == ["done", "300", "300", "0"] and "all-MiniLM-L6-v2" in row

    # the same command again: the job is known and done; nothing is embedded twice
    again = _run(
        [
            "reindex",
            str(docs),
            "--out",
            str(out),
            "--nats",
            stack.nats_url,
            "--batch-size",
            "32",
            "--quiet",
            "--stall-timeout",
            "30",
        ]
    )
    assert again.returncode == 0, again.stderr
    np.testing.assert_allclose(np.load(out), vectors, atol=1e-6)
    # each run's rate is its own work over its own time: the first embedded all 300; the second read
    # them back (stored by the first) and embedded none, so it claims no rate
    assert "300 documents (300 embedded in this run, " in result.stdout and "earlier run" not in result.stdout, (
        result.stdout
    )
    assert " 0 tokens in " not in result.stdout
    assert "300 documents (0 embedded in this run, 0 tokens in " in again.stdout, again.stdout
    assert "(0.0 docs/s, 0 tokens/s); 300 stored by an earlier run) -> " in again.stdout, again.stdout


def test_a_job_sent_to_an_idle_stack_is_done_at_once(stack):
    """Idle, the tokenizer's and worker's fetches wait seconds at the server (they ask rarely); a job
    sent then is taken by both stages as it arrives, not when their waits end."""
    import time

    import httpx

    from embedfleet.shared.jobs.work_queue import FETCH_WAIT

    time.sleep(FETCH_WAIT + 1)  # the scenario: both stages idle, each in a fetch left waiting
    sent = time.monotonic()
    r = httpx.post(
        f"{stack.base_url}/v1/jobs", json={"documents": [{"id": "idle-0", "text": "after a quiet while"}]}, timeout=60
    )
    assert r.status_code == 202, r.text
    job, state = r.json()["id"], {}
    while time.monotonic() - sent < 30 and state.get("status") != "done":
        state = httpx.get(f"{stack.base_url}/v1/jobs/{job}").json()
        time.sleep(0.05)
    took = time.monotonic() - sent
    assert state["status"] == "done" and state["done"] == 1, state
    assert took < FETCH_WAIT - 1, took  # two stages that waited out their fetches would take 5 s or more


def test_reindex_refuses_bad_input(stack, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n')
    result = _run(["reindex", str(bad), "--out", str(tmp_path / "o.npy"), "--nats", stack.nats_url])
    assert result.returncode == 2 and 'must be a JSON object with "id" and "text"' in result.stderr


def test_jobs_over_http(stack, reference):
    import time

    import httpx

    texts = mixed_texts(40)
    docs = [{"id": f"h{i}", "text": t} for i, t in enumerate(texts)]
    r = httpx.post(f"{stack.base_url}/v1/jobs", json={"documents": docs, "batch_size": 16}, timeout=60)
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    assert r.json()["documents"] == 40 and r.json()["model"] == "all-MiniLM-L6-v2"
    deadline = time.monotonic() + 60
    state = {}
    while time.monotonic() < deadline:
        state = httpx.get(f"{stack.base_url}/v1/jobs/{job}").json()
        if state.get("status") == "done":
            break
        time.sleep(0.2)
    assert state["status"] == "done" and state["done"] == 40 and state["batches"] == 3, state
    assert state["published"] == 3 and state["tokens"] > 0 and not state.get("errors")

    missing = httpx.get(f"{stack.base_url}/v1/jobs/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    no_dir = httpx.post(f"{stack.base_url}/v1/jobs", json={"path": "/etc/passwd"}, timeout=30)
    assert no_dir.status_code == 400 and "--jobs-dir" in no_dir.json()["error"]["message"]
    bad = httpx.post(f"{stack.base_url}/v1/jobs", json={"documents": [{"id": "a"}]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "documents.text", bad.text
    assert (
        bad.json()["error"]["message"]
        == "'documents[0].text' is required (or 'image', a data URI, for a two-tower model)"
    )


def test_malformed_batch_becomes_a_dead_letter(stack):
    """A batch published by some client with a document that is not text: given up at once by the
    tokenizer, kept in the dead-letter stream, counted as failed; the rest of the job is stored."""
    import asyncio

    import msgpack
    import nats

    from embedfleet.shared.jobs.bucket import update_state
    from embedfleet.shared.jobs.claims import make_claim
    from embedfleet.shared.jobs.streams import ensure_streams, stream_names
    from embedfleet.shared.nats.subjects import Subjects
    from embedfleet.shared.protocol import EmbedOptions, JobBatch, encode
    from tests.support.job_states import submitted
    from tests.support.procs import job_settled

    subjects = Subjects("embedfleet")
    model = "all-MiniLM-L6-v2"

    async def main() -> dict:
        nc = await nats.connect(stack.nats_url)
        js = nc.jetstream()
        kv = await ensure_streams(js, subjects)
        await update_state(kv, "poison", submitted(6, model=model, batches=2, status="running"))
        good = JobBatch("poison", 0, model, ["a", "b", "c"], ["one", "two", "three"], EmbedOptions())
        claim = await make_claim(js, subjects, "gateway", "poison", None)  # its batches signed, as a gateway's
        await js.publish(
            subjects.jobs(model), encode(good), headers={"Nats-Msg-Id": "poison:0", **claim.sign(encode(good))}
        )
        bad = msgpack.packb(
            {
                "v": 2,
                "t": "job",
                "jb": "poison",
                "bi": 1,
                "m": model,
                "di": ["d", "e", "f"],
                "x": ["four", 5, "six"],
                "o": {},
            }
        )
        await js.publish(subjects.jobs(model), bad, headers={"Nats-Msg-Id": "poison:1", **claim.sign(bad)})
        state = await job_settled(kv, "poison")
        letter = await js.get_last_msg(stream_names(subjects)["dead"], subjects.dead("poison"))
        await nc.close()
        return {**state, "letter": letter}

    state = asyncio.run(main())
    assert state["status"] == "done_with_errors" and state["done"] == 3 and state["failed"] == 3
    (dead,) = state["dead"]
    assert dead["stage"] == "tokenizer" and dead["batch"] == 1 and dead["documents"] == 3 and dead["deliveries"] == 1
    assert "x" in dead["reason"] or "text" in dead["reason"], dead
    assert state["letter"].headers["Embedfleet-Stage"] == "tokenizer"
    assert state["letter"].headers["Embedfleet-Deliveries"] == "1"


def test_reindex_in_int8_writes_the_online_routes_int8_rows(stack, tmp_path):
    """--embedding-type int8: the .npy holds int8 rows, as /v1/embeddings answers them for the same
    texts; the same file in binary is another job; the int8 job's id with another form is refused."""
    import httpx

    texts = mixed_texts(64)
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"q-{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    common = ["--nats", stack.nats_url, "--batch-size", "16", "--quiet", "--stall-timeout", "30"]
    out = tmp_path / "int8.npy"
    result = _run(["reindex", str(docs), "--out", str(out), "--embedding-type", "int8", *common])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "int8 vectors" in result.stdout
    job = result.stdout.split()[1].rstrip(":")
    stored = np.load(out)
    assert stored.dtype == np.int8 and stored.shape == (64, 384)

    def online(form: str) -> np.ndarray:
        r = httpx.post(
            f"{stack.base_url}/v1/embeddings",
            json={"model": "all-MiniLM-L6-v2", "input": texts, "embedding_type": form},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        return np.array([d["embedding"] for d in r.json()["data"]])

    # bulk and online batches differ, so a float may differ in its last bits and round one step apart
    diff = np.abs(stored.astype(np.int16) - online("int8"))
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.999, (diff.max(), (diff == 0).mean())
    state = httpx.get(f"{stack.base_url}/v1/jobs/{job}").json()
    assert (state["status"], state["embedding_type"], state["dim"]) == ("done", "int8", 384), state
    listing = _run(["jobs", "--nats", stack.nats_url])
    assert next(line for line in listing.stdout.splitlines() if line.startswith(job)).split()[-1] == "int8"

    binary_out = tmp_path / "binary.npy"
    again = _run(["reindex", str(docs), "--out", str(binary_out), "--embedding-type", "binary", *common])
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.split()[1].rstrip(":") != job  # another form, another job: nothing resumed from the int8 one
    packed = np.load(binary_out)
    assert packed.dtype == np.int8 and packed.shape == (64, 48)
    floats = online("float")
    bits = np.unpackbits((packed.astype(np.int16) + 128).astype(np.uint8), axis=1).astype(bool)
    clear = np.abs(floats) > 1e-4
    assert np.array_equal(bits[clear], (floats > 0)[clear])

    refused = _run(
        ["reindex", str(docs), "--out", str(tmp_path / "u.npy"), "--job-id", job, "--embedding-type", "uint8", *common]
    )
    assert refused.returncode == 2 and f"job {job} makes int8 vectors, not uint8" in refused.stderr


def test_jobs_over_http_take_embedding_type(stack):
    import time

    import httpx

    docs = [{"id": f"b{i}", "text": t} for i, t in enumerate(mixed_texts(8))]
    r = httpx.post(
        f"{stack.base_url}/v1/jobs",
        json={"documents": docs, "embedding_type": "ubinary", "id": "forms-http"},
        timeout=60,
    )
    assert r.status_code == 202, r.text
    assert r.json()["embedding_type"] == "ubinary"
    deadline = time.monotonic() + 60
    state = {}
    while time.monotonic() < deadline and state.get("status") != "done":
        state = httpx.get(f"{stack.base_url}/v1/jobs/forms-http").json()
        time.sleep(0.2)
    assert state["status"] == "done" and state["embedding_type"] == "ubinary", state
    # the same id in another form would mix forms in one job's results: a conflict with the job there
    clash = httpx.post(
        f"{stack.base_url}/v1/jobs", json={"documents": docs, "embedding_type": "int8", "id": "forms-http"}, timeout=30
    )
    assert clash.status_code == 409 and clash.json()["error"]["param"] == "id"
    assert "makes ubinary vectors, not int8" in clash.json()["error"]["message"]
    bad = httpx.post(f"{stack.base_url}/v1/jobs", json={"documents": docs, "embedding_type": "int4"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "embedding_type"


def test_cancelled_job_stops_and_the_next_job_runs_at_full_speed(stack, tmp_path):
    """A 3,000-document job cancelled 3 s in (`embedfleet jobs cancel`): its reindex exits saying so,
    the batches it queued are dropped unrun within seconds, its state says cancelled with what was
    stored, and what was stored stays readable; the next job runs as fast as the same job before."""
    import asyncio
    import time
    from collections import Counter

    import httpx
    import nats

    from embedfleet.shared.jobs.streams import stream_names
    from embedfleet.shared.nats.subjects import Subjects
    from embedfleet.shared.protocol import JobResult, decode_as
    from tests.support.procs import wait_until

    subjects, model, url = Subjects("embedfleet"), "all-MiniLM-L6-v2", stack.nats_url
    texts = mixed_texts(3000)
    big, small = tmp_path / "big.jsonl", tmp_path / "small.jsonl"
    big.write_text("".join(json.dumps({"id": f"c{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    small.write_text("".join(json.dumps({"id": f"s{i}", "text": t}) + "\n" for i, t in enumerate(texts[:128])))
    common = ["--nats", url, "--batch-size", "32", "--quiet", "--stall-timeout", "60"]

    def timed(job: str) -> float:
        started = time.monotonic()
        result = _run(["reindex", str(small), "--out", str(tmp_path / f"{job}.npy"), "--job-id", job, *common])
        assert result.returncode == 0, result.stdout + result.stderr
        return time.monotonic() - started

    def state(job: str) -> dict:
        return httpx.get(f"{stack.base_url}/v1/jobs/{job}", timeout=10).json()

    async def queued() -> int:
        """Batches of the model queued in the jobs and bulk streams."""
        nc = await nats.connect(url)
        try:
            js, names, count = nc.jetstream(), stream_names(subjects), 0
            for stream, subject in ((names["jobs"], subjects.jobs(model)), (names["bulk"], subjects.bulk(model))):
                info = await js.stream_info(stream, subjects_filter=subject)
                count += (info.state.subjects or {}).get(subject, 0)
            return count
        finally:
            await nc.close()

    async def stored() -> Counter:
        """How many times each document of the cancelled job is stored in the results stream."""
        nc = await nats.connect(url)
        counts: Counter = Counter()
        try:
            sub = await nc.jetstream().subscribe(subjects.results("cancel-big"), ordered_consumer=True)
            while True:
                try:
                    counts.update(decode_as((await sub.next_msg(timeout=1)).data, JobResult).doc_ids)
                except Exception:
                    return counts
        finally:
            await nc.close()

    before = timed("speed-before")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "embedfleet.services.cli",
            "reindex",
            str(big),
            "--out",
            str(tmp_path / "big.npy"),
            "--job-id",
            "cancel-big",
            *common,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started = time.monotonic()
    try:
        wait_until(
            lambda: time.monotonic() - started >= 3 and state("cancel-big").get("done", 0) > 0, 60, "the job running"
        )
        cancelled = _run(["jobs", "cancel", "cancel-big", "--nats", url])
        told = time.monotonic()
        assert cancelled.returncode == 0 and "job cancel-big cancelled:" in cancelled.stdout, (
            cancelled.stdout + cancelled.stderr
        )
        assert proc.wait(15) == 1
    finally:
        proc.kill()
    told_reindex = proc.stdout.read()
    assert "job cancel-big: cancelled" in told_reindex and not (tmp_path / "big.npy").exists()
    exited = time.monotonic() - told
    wait_until(lambda: asyncio.run(queued()) == 0, 15, "the cancelled job's batches dropped")
    dropped = time.monotonic() - told
    after = timed("speed-after")

    final = state("cancel-big")
    assert final["status"] == "cancelled" and final["cancelled"] >= final["started"], final
    assert 0 < final["done"] <= 1500 and final["documents"] == 3000 and "accounted" not in final, final
    rows = asyncio.run(stored())
    assert len(rows) == final["done"] and set(rows.values()) == {1}  # readable, and counted exactly
    # one figure everywhere, frozen by the cancel: what `jobs cancel` said, what reindex said, what
    # `jobs` and the API show once the batches that were running when it came have finished
    said = f"{final['done']} of 3000 documents stored"
    assert f"job cancel-big cancelled: {said}" in cancelled.stdout, (cancelled.stdout, final)
    assert f"job cancel-big: cancelled, {said}" in told_reindex, (told_reindex, final)
    listed = _run(["jobs", "--nats", url]).stdout
    row = next(line.split() for line in listed.splitlines() if line.startswith("cancel-big "))
    assert row[1:4] == ["cancelled", "3000", str(final["done"])], listed
    again = httpx.delete(f"{stack.base_url}/v1/jobs/cancel-big", timeout=10)
    assert again.status_code == 200 and again.json()["status"] == "cancelled" and again.json()["done"] == final["done"]
    finished = httpx.delete(f"{stack.base_url}/v1/jobs/speed-before", timeout=10)
    assert finished.status_code == 200 and finished.json()["status"] == "done"  # a finished job keeps its state
    missing = httpx.delete(f"{stack.base_url}/v1/jobs/nope", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    rerun = _run(["reindex", str(big), "--out", str(tmp_path / "big.npy"), "--job-id", "cancel-big", *common])
    assert rerun.returncode == 2 and "job cancel-big was cancelled: purge it" in rerun.stderr
    print(
        f"cancelled at {final['done']} documents stored; reindex exited {exited:.1f}s and the queued batches were "
        f"gone {dropped:.1f}s after; the next job {after:.1f}s, the same job before {before:.1f}s"
    )
    # left to run, the cancelled job's queued batches would hold the next job back for a minute (the 3,000
    # documents' batches: over 60 s on these cores); twice the first run and 10 s covers what the suite's
    # other processes take from two shared cores in one run and not the other (8.9 s after 4.7 s has been
    # seen in a full run; alone the two take the same) and still fails that minute's hold
    assert after <= 2 * before + 10.0, (after, before)
