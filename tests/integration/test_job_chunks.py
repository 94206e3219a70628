"""Chunked bulk jobs on the real stack (nats-server, tokenizer, two workers, gateway as processes):
every document cut once by the tokenizer, a row a chunk, each chunk's vector the reference's for its
text, each (document, chunk) once; through `reindex`, POST /v1/jobs and the results route; a document
cut into too many chunks failing alone; a cancel's counts of documents and chunks; bad options refused."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from embedfleet.services.gateway.jobs.answers import JobResultLine, JobStatus, JobSubmitted
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import long_texts, mixed_texts
from tests.support.late_reference import Reference
from tests.support.procs import cli, job_finished, stored_chunks, wait_until

pytestmark = pytest.mark.integration

PARQUET = "application/vnd.apache.parquet"
ROOT = Path(__file__).resolve().parents[2]
ROOM = 254  # MiniLM's 256 tokens less [CLS] and [SEP]: what a late window holds


def _jsonl(path, docs: list[tuple[str, str]]) -> None:
    path.write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in docs))


def check_rows(
    docs: list[tuple[str, str]],
    rows: list[dict],
    vectors: np.ndarray,
    reference,
    texts: bool = False,
    late: Reference | None = None,
) -> dict[str, int]:
    """``rows`` (``{"id", "chunk", "start", "end"[, "text"]}``, in input order) against ``docs``: each
    document's chunks 0..n-1 once and in order, covering its text (only whitespace between two chunks),
    texts ``text[start:end]``, and each vector the reference's for that text (``late``: the late
    reference's, pooled in its window of the document). Returns chunks a document."""
    by_id = dict(docs)
    counts: dict[str, int] = {}
    for row in rows:
        assert row["chunk"] == counts.get(row["id"], 0), row  # (id, chunk) once, in order, none missing inside
        counts[row["id"]] = row["chunk"] + 1
    assert list(counts) == [d for d, _ in docs]  # every document, in input order
    at = 0
    for doc_id, text in docs:
        mine = rows[at : at + counts[doc_id]]
        at += counts[doc_id]
        starts, ends = [r["start"] for r in mine], [r["end"] for r in mine]
        assert text[: starts[0]].strip() == "" and text[ends[-1] :].strip() == "", (doc_id, starts, ends)
        for k in range(1, len(mine)):
            assert starts[k - 1] < starts[k] and ends[k - 1] < ends[k], (doc_id, k)
            assert text[ends[k - 1] : starts[k]].strip() == "", (doc_id, k)  # nothing between two chunks is lost
        if texts:
            assert [r["text"] for r in mine] == [text[s:e] for s, e in zip(starts, ends)]
    if late is not None:
        want = np.concatenate(
            [late.late_vectors(text, [(r["start"], r["end"]) for r in rows if r["id"] == d], ROOM) for d, text in docs]
        )
    else:
        want = reference.encode([by_id[r["id"]][r["start"] : r["end"]] for r in rows], batch_size=64)
    c = cosines(vectors, want)
    assert c.min() >= COSINE_TOLERANCE, (c.min(), rows[int(c.argmin())])
    return counts


@pytest.fixture(scope="module")
def corpus() -> list[tuple[str, str]]:
    """120 documents: queries of a few words (one chunk), paragraphs, and whole help topics of
    thousands of tokens (12 past the model's 256, the longest 5,200). The corpus's 8,600-token topic
    (its 40th text) gives way to a 500-token one (its 160th): as many documents past the limit, a
    quarter fewer tokens to embed here and in the reference."""
    texts = mixed_texts(160)
    return [(f"doc-{i}", t) for i, t in enumerate([*texts[:39], texts[159], *texts[40:120]])]


def test_a_chunked_reindex_embeds_every_chunk_as_the_reference(stack, reference, corpus, tmp_path):
    docs = tmp_path / "docs.jsonl"
    _jsonl(docs, corpus)
    out = tmp_path / "chunks.npy"
    args = [
        "reindex",
        str(docs),
        "--out",
        str(out),
        "--nats",
        stack.nats_url,
        "--batch-size",
        "16",
        "--quiet",
        "--stall-timeout",
        "60",
        "--chunk-size",
        "96",
        "--chunk-overlap",
        "16",
        "--chunk-boundary",
        "sentence",
        "--with-text",
    ]
    result = cli(args, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    job = result.stdout.split()[1].rstrip(":")
    rows = [json.loads(line) for line in out.with_suffix(".chunks.jsonl").read_text().splitlines()]
    vectors = np.load(out)
    assert vectors.shape == (len(rows), 384) and json.loads(out.with_suffix(".ids.json").read_text()) == [
        r["id"] for r in rows
    ]
    counts = check_rows(corpus, rows, vectors, reference, texts=True)
    long = [len(reference.tokenizer(t)["input_ids"]) > 256 for _, t in corpus]
    assert sum(long) >= 10 and all(counts[d] > 1 for (d, _), over in zip(corpus, long) if over)
    assert sum(n == 1 for n in counts.values()) >= 50  # short documents: one chunk each
    assert f"120 documents in {len(rows)} chunks" in result.stdout, result.stdout

    state = httpx.get(f"{stack.base_url}/v1/jobs/{job}", timeout=10).json()
    assert (state["status"], state["documents"], state["done"], state.get("failed", 0)) == ("done", 120, 120, 0), state
    assert state["chunks"] == state["chunks_done"] == len(rows) and not state.get("chunks_failed"), state
    assert state["chunking"] == {"size": 96, "overlap": 16, "boundary": "sentence", "late": False, "with_text": True}
    assert not {"accounted", "accounted_chunks", "cut"} & set(state), state
    stored = asyncio.run(_stored(stack.nats_url, job))
    assert len(stored) == len(rows) and set(stored.values()) == {1}
    listing = cli(["jobs", "--nats", stack.nats_url], timeout=180).stdout
    row = next(line.split() for line in listing.splitlines() if line.startswith(job))
    assert row[1:5] == ["done", "120", "120", "0"] and row[11] == f"{len(rows)}/{len(rows)}", listing

    # the same job written as Parquet: the same rows (the job is done: read back, not embedded again)
    again = cli([*args[:3], str(tmp_path / "chunks.parquet"), *args[4:]], timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr
    table = pq.read_table(tmp_path / "chunks.parquet")
    assert table.column_names == ["id", "chunk", "start", "end", "vector", "text"]
    assert json.loads(table.schema.metadata[b"chunking"]) == state["chunking"]
    assert table.select(["id", "chunk", "start", "end", "text"]).to_pylist() == rows
    np.testing.assert_array_equal(np.stack(table.column("vector").to_numpy(zero_copy_only=False)), vectors)


async def _stored(url: str, job: str):
    import nats

    from embedfleet.shared.nats.subjects import Subjects

    nc = await nats.connect(url)
    try:
        return await stored_chunks(nc.jetstream(), Subjects("embedfleet").results(job))
    finally:
        await nc.close()


def test_a_chunked_job_over_http_and_its_results(stack, reference, corpus, tmp_path):
    docs = corpus[:48]
    body = {
        "id": "chunks-http",
        "documents": [{"id": d, "text": t} for d, t in docs],
        "batch_size": 8,
        "chunking": {"size": 64, "overlap": 8},
        "with_text": True,
    }
    r = httpx.post(f"{stack.base_url}/v1/jobs", json=body, timeout=60)
    assert r.status_code == 202, r.text
    JobSubmitted.model_validate_json(r.content)  # the answer is its documented model, strictly
    assert r.json()["chunking"] == {"size": 64, "overlap": 8, "boundary": "token", "late": False, "with_text": True}
    state = job_finished(stack.base_url, "chunks-http", 180)
    assert (state["status"], state["done"], state["documents"]) == ("done", 48, 48), state
    assert state["chunks"] == state["chunks_done"] > 48, state

    r = httpx.get(f"{stack.base_url}/v1/jobs/chunks-http/results", timeout=60)
    assert (r.headers["x-job-done"], r.headers["x-job-chunks"]) == ("48", str(state["chunks_done"]))
    for line in r.content.splitlines():
        JobResultLine.model_validate_json(line)
    lines = [orjson.loads(line) for line in r.content.splitlines()]
    assert all(set(line) == {"id", "chunk", "start", "end", "text", "vector"} for line in lines), lines[0]
    assert len(lines) == state["chunks"]
    order = {d: i for i, (d, _) in enumerate(docs)}
    lines.sort(key=lambda line: (order[line["id"]], line["chunk"]))  # streamed in the order stored
    vectors = np.array([line.pop("vector") for line in lines], dtype=np.float32)
    check_rows(docs, lines, vectors, reference, texts=True)

    r = httpx.get(f"{stack.base_url}/v1/jobs/chunks-http/results", headers={"accept": PARQUET}, timeout=60)
    table = pq.read_table(io.BytesIO(r.content))
    assert table.column_names == ["id", "chunk", "start", "end", "vector", "text"]
    assert (
        sorted(
            table.select(["id", "chunk", "start", "end", "text"]).to_pylist(),
            key=lambda row: (order[row["id"]], row["chunk"]),
        )
        == lines
    )

    fetched = cli(
        ["jobs", "fetch", "chunks-http", "--out", str(tmp_path / "f.npy"), "--nats", stack.nats_url], timeout=180
    )
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert f"48 of 48 documents in {len(lines)} chunks" in fetched.stdout
    assert [json.loads(x) for x in (tmp_path / "f.chunks.jsonl").read_text().splitlines()] == lines  # input order
    np.testing.assert_allclose(np.load(tmp_path / "f.npy"), vectors, atol=1e-6)


def test_a_document_cut_into_too_many_chunks_fails_alone(stack, tmp_path):
    """Chunks of one token: a document of 1,100 words makes more than the tokenizer's --max-chunks
    (1,024): it is given up (a dead letter holding it, counted failed); the job's others are stored.
    reindex sized the batches to the limit first (its characters count past it): a document a batch."""
    docs = [("short-a", "a first short one"), ("too-long", " ".join(["word"] * 1100)), ("short-b", "and another")]
    path = tmp_path / "docs.jsonl"
    _jsonl(path, docs)
    out = tmp_path / "v.parquet"
    result = cli(
        [
            "reindex",
            str(path),
            "--out",
            str(out),
            "--nats",
            stack.nats_url,
            "--quiet",
            "--stall-timeout",
            "60",
            "--chunk-size",
            "1",
            "--job-id",
            "too-many-chunks",
        ],
        timeout=180,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert json.loads(out.with_suffix(".failed.json").read_text()) == ["too-long"]
    table = pq.read_table(out)
    assert table.select(["id", "chunk"]).to_pylist() == [{"id": "short-a", "chunk": k} for k in range(4)] + [
        {"id": "short-b", "chunk": k} for k in range(2)
    ]
    state = httpx.get(f"{stack.base_url}/v1/jobs/too-many-chunks", timeout=10).json()
    assert (state["status"], state["done"], state["failed"], state["chunks_done"]) == ("done_with_errors", 2, 1, 6), (
        state
    )
    (dead,) = state["dead"]
    assert (dead["stage"], dead["batch"], dead["start"], dead["documents"]) == ("tokenizer", 1, 0, 1), dead
    assert "batch size cut from 64 to 1: a chunked batch is cut into at most 1,024 chunks" in result.stdout
    assert "'too-long' is cut into 1100 chunks, over the 1024" in dead["reason"], dead


def test_a_cancelled_chunked_job_keeps_exact_counts(stack):
    """Cancelled mid-way: the state's documents and chunks stored stay as the cancel left them, and the
    results stream holds exactly those chunks, each once, the documents done being those whole there."""
    docs = [{"id": f"long-{i}", "text": t} for i, t in enumerate(long_texts(200))]
    r = httpx.post(
        f"{stack.base_url}/v1/jobs",
        json={"id": "chunks-cancel", "documents": docs, "batch_size": 8, "chunking": {"size": 32}},
        timeout=60,
    )
    assert r.status_code == 202, r.text
    state = lambda: httpx.get(f"{stack.base_url}/v1/jobs/chunks-cancel", timeout=10).json()  # noqa: E731
    wait_until(lambda: state().get("done", 0) > 0, 120, "a document's chunks all stored")
    cancelled = httpx.delete(f"{stack.base_url}/v1/jobs/chunks-cancel", timeout=10)
    JobStatus.model_validate_json(cancelled.content)  # the state after, as documented
    told = cancelled.json()
    assert told["status"] == "cancelled" and 0 < told["done"] < 200, told
    time.sleep(3)  # batches running when the cancel came end; their rows are found late and removed
    final = state()
    assert {k: final.get(k) for k in ("done", "chunks_done", "failed")} == {
        k: told.get(k) for k in ("done", "chunks_done", "failed")
    }
    stored = asyncio.run(_stored(stack.nats_url, "chunks-cancel"))
    assert sum(stored.values()) == len(stored) == final["chunks_done"], (len(stored), final)
    assert final["chunks"] >= final["chunks_done"] and final["documents"] == 200
    per_document = Counter(d for d, _, _ in stored)
    whole = {d for d, _, n in stored if per_document[d] == n}
    assert final["done"] == len(whole), (final["done"], len(whole))  # a document is done when all its chunks are


@pytest.fixture(scope="module")
def late_ref(model_info) -> Reference:
    assert model_info.max_seq_length == 256  # what ROOM is made from
    return Reference(model_info.path)


@pytest.fixture(scope="module")
def late_corpus() -> list[tuple[str, str]]:
    """48 documents: queries (one chunk), paragraphs (a few chunks in one window), whole help
    topics past the model's 256 tokens (several windows each, one of 5,000 tokens), and an empty one.
    The corpus's 8,600-token topic (its 40th text) gives way to a 350-token one (its 67th): windows
    enough, at half the tokens to embed and to pool in the test."""
    texts = mixed_texts(67)
    return [(f"late-{i}", t) for i, t in enumerate([*texts[:39], texts[66], *texts[40:47], ""])]


def test_a_late_chunked_reindex_pools_each_chunk_in_its_window(stack, late_ref, late_corpus, tmp_path):
    docs = tmp_path / "docs.jsonl"
    _jsonl(docs, late_corpus)
    out = tmp_path / "late.parquet"
    result = cli(
        [
            "reindex",
            str(docs),
            "--out",
            str(out),
            "--nats",
            stack.nats_url,
            "--batch-size",
            "8",
            "--quiet",
            "--stall-timeout",
            "60",
            "--chunk-size",
            "64",
            "--chunk-overlap",
            "8",
            "--late-chunking",
            "--with-text",
        ],
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job = result.stdout.split()[1].rstrip(":")
    table = pq.read_table(out)
    assert table.column_names == ["id", "chunk", "start", "end", "vector", "text"]
    rows = table.select(["id", "chunk", "start", "end", "text"]).to_pylist()
    vectors = np.stack(table.column("vector").to_numpy(zero_copy_only=False))
    counts = check_rows(late_corpus, rows, vectors, None, texts=True, late=late_ref)
    windows = {d: len(late_ref.offsets(t)) > ROOM for d, t in late_corpus}  # read in several windows
    assert sum(windows.values()) >= 4 and all(counts[d] > 4 for d, over in windows.items() if over)
    assert sum(n == 1 for n in counts.values()) >= 10 and any(n > 1 for d, n in counts.items() if not windows[d])
    state = httpx.get(f"{stack.base_url}/v1/jobs/{job}", timeout=10).json()
    assert (state["status"], state["done"], state.get("failed", 0)) == ("done", 48, 0), state
    assert state["chunks"] == state["chunks_done"] == len(rows) and state["chunking"]["late"] is True, state
    stored = asyncio.run(_stored(stack.nats_url, job))
    assert len(stored) == len(rows) and set(stored.values()) == {1}


def test_a_late_chunked_job_over_http_has_plain_chunkings_rows(stack, late_ref, late_corpus):
    body = {"documents": [{"id": d, "text": t} for d, t in late_corpus], "batch_size": 8, "with_text": True}
    lines = {}
    for late in (True, False):
        job = f"late-http-{late}".lower()
        r = httpx.post(
            f"{stack.base_url}/v1/jobs",
            # the command's chunking above: the same chunks, so the late reference is computed once for both
            json={**body, "id": job, "chunking": {"size": 64, "overlap": 8, "late": late}},
            timeout=60,
        )
        assert r.status_code == 202 and r.json()["chunking"]["late"] is late, r.text
        state = job_finished(stack.base_url, job, 180)
        assert (state["status"], state["done"]) == ("done", 48) and state["chunks"] == state["chunks_done"], state
        got = [
            orjson.loads(line)
            for line in httpx.get(f"{stack.base_url}/v1/jobs/{job}/results", timeout=60).content.splitlines()
        ]
        order = {d: i for i, (d, _) in enumerate(late_corpus)}
        lines[late] = sorted(got, key=lambda line: (order[line["id"]], line["chunk"]))
    vectors = {late: np.array([line.pop("vector") for line in lines[late]], np.float32) for late in lines}
    assert lines[True] == lines[False]  # the same chunks: ids, offsets, texts
    check_rows(late_corpus, lines[True], vectors[True], None, texts=True, late=late_ref)
    # pooled in context, not from the chunk alone: a document of several chunks gets other vectors
    several = [i for i, line in enumerate(lines[True]) if line["chunk"] > 0]
    assert cosines(vectors[True][several], vectors[False][several]).min() < 0.98


def test_bad_chunking_options_are_refused(stack, tmp_path):
    path = tmp_path / "docs.jsonl"
    _jsonl(path, [("a", "one"), ("b", "two")])
    common = ["reindex", str(path), "--out", str(tmp_path / "o.npy"), "--nats", stack.nats_url, "--quiet"]
    for args, said in [
        (["--chunk-size", "0"], "--chunk-size must be an integer of at least 1, got 0"),
        (["--chunk-size", "8", "--chunk-overlap", "8"], "--chunk-overlap (8) must be less than --chunk-size (8)"),
        (["--chunk-size", "8", "--chunk-overlap", "-1"], "--chunk-overlap must be an integer of at least 0, got -1"),
        (
            ["--chunk-size", "8", "--chunk-boundary", "paragraph"],
            "argument --chunk-boundary: invalid choice: 'paragraph'",
        ),
        (["--chunk-size", "eight"], "argument --chunk-size: invalid int value: 'eight'"),
        (["--chunk-size", "600"], "--chunk-size is 600; this model holds at most 254 tokens of text a chunk"),
        (["--with-text"], "--with-text needs --chunk-size"),
        (["--chunk-overlap", "2"], "--chunk-overlap needs --chunk-size"),
        (["--chunk-size", "8", "--output", "sparse"], "chunked jobs make a dense vector a chunk"),
    ]:
        result = cli([*common, *args], timeout=60)
        assert result.returncode == 2 and said in result.stderr, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "o.npy").exists()

    documents = [{"id": "a", "text": "one"}]
    for fields, param, said in [
        ({"chunking": {"size": 0}}, "chunking.size", "'chunking.size' must be at least 1, got 0"),
        ({"chunking": {"size": "8"}}, "chunking.size", "'chunking.size' must be an integer, got '8'"),
        (
            {"chunking": {"size": 8, "overlap": 8}},
            "chunking",
            "chunking.overlap (8) must be less than chunking.size (8)",
        ),
        ({"chunking": {"size": 8, "boundary": "page"}}, "chunking.boundary", "'chunking.boundary' must be 'token' or"),
        ({"chunking": {"size": 8, "return": "mean"}}, "chunking", "'chunking' has unknown keys 'return'"),
        ({"chunking": 8}, "chunking", "'chunking' must be an object"),
        ({"chunking": {"size": 600}}, "chunking.size", "chunking.size is 600; this model holds at most 254"),
        ({"chunking": {"size": 8, "late": "no"}}, "chunking.late", "'chunking.late' must be true or false, got 'no'"),
        ({"with_text": True}, "with_text", "'with_text' stores each chunk's text: give 'chunking' too"),
        ({"chunking": {"size": 8}, "with_text": "yes"}, "with_text", "'with_text' must be true or false, got 'yes'"),
    ]:
        r = httpx.post(
            f"{stack.base_url}/v1/jobs", json={"id": "refused-chunks", "documents": documents, **fields}, timeout=30
        )
        assert r.status_code == 400, (fields, r.text)
        error = r.json()["error"]
        assert error["param"] == param and said in error["message"] and error["code"] == "invalid_request", (
            fields,
            error,
        )
    assert httpx.get(f"{stack.base_url}/v1/jobs/refused-chunks", timeout=10).status_code == 404  # nothing published


def test_the_docs_chunking_example_runs_as_typed(stack, tmp_path):
    """docs/bulk-jobs.md's chunking example, typed into a shell against this stack (its gateway for
    127.0.0.1:8080, its NATS server given by the environment)."""
    text = (ROOT / "docs" / "bulk-jobs.md").read_text()
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "chunked-job" in b]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "EMBEDFLEET_NATS_URL": stack.nats_url,
        "PYTHONPATH": str(ROOT),
    }  # this checkout's embedfleet
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.replace("http://127.0.0.1:8080", stack.base_url)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    guide = json.loads((tmp_path / "guide.jsonl").read_text())["text"]
    table = pq.read_table(tmp_path / "guide.parquet").drop(["vector"]).to_pylist()
    assert len(table) > 2 and all(row["text"] == guide[row["start"] : row["end"]] for row in table)
    assert str(table[:2]) in done.stdout
    lines = [orjson.loads(line) for line in done.stdout.splitlines() if line.startswith('{"id":"a"')]
    assert [(line["chunk"], line["start"], line["end"], line["text"]) for line in lines] == [
        (0, 0, 17, "A first document."),
        (1, 18, 39, "It has two sentences."),
    ]
    assert all(len(line["vector"]) == 384 for line in lines)
