"""Sparse and multi-vector outputs through the whole stack — HTTP, NATS, tokenizer, worker, as
processes — against their references on tiny random checkpoints: SPLADE vs SparseEncoder.encode
(same nonzero set, cosine >= 0.9999 on the densified rows), a ColBERT-style folder vs
MultiVectorEncoder, BGE-M3's dense / sparse / colbert outputs vs its own modules, and TEI's
/embed_all token states."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.conftest import cosines
from tests.support.output_models import (
    bge_m3_reference,
    build_bge_m3,
    build_colbert,
    build_splade,
    colbert_reference,
    densify,
    splade_reference,
)
from tests.support.procs import post, running_fleet, wait_until

pytestmark = pytest.mark.integration

PREFIX = "outputs"
SPLADE = "splade-max-relu"
COSINE = 0.9999
TEXTS = [
    "hello world, a test!",
    "the quick brown fox jumps over the lazy dog.",
    "x",
    "search: sparse, dense; multi-vector? " * 6,
]


@pytest.fixture(scope="module")
def fleet(nats_url: str, tmp_path_factory) -> Iterator[tuple[str, dict]]:
    root = tmp_path_factory.mktemp("output-models")
    folders = {"splade": build_splade(root), "colbert": build_colbert(root), "bge-m3": build_bge_m3(root)}
    assert [f.name for f in folders.values()] == ["splade-max-relu", "colbert", "bge-m3"]
    log_dir = tmp_path_factory.mktemp("output-logs")
    with running_fleet(nats_url, PREFIX, folders, log_dir) as (base_url, _):  # each served as its folder's name
        yield base_url, folders


def _sparse(base_url: str, model: str, **extra) -> list[list[dict]]:
    r = post(base_url, "/embed_sparse", {"model": model, "inputs": TEXTS, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_splade_over_http_equals_sparse_encoder(fleet):
    base_url, folders = fleet
    ref = splade_reference(folders["splade"], TEXTS)
    rows = _sparse(base_url, SPLADE)
    assert len(rows) == len(TEXTS)
    got = np.stack([densify([e["index"] for e in row], [e["value"] for e in row], ref.shape[1]) for row in rows])
    assert np.array_equal(got > 0, ref > 0), "the nonzero sets differ"
    assert cosines(got, ref).min() >= COSINE
    for row in rows:
        assert [e["index"] for e in row] == sorted(e["index"] for e in row)


def test_embed_sparse_answers_the_named_model_not_the_default(fleet):
    """Two sparse models served: the body's ``model`` picks one; none named is the default (the first
    id in order, bge-m3)."""
    base_url, folders = fleet
    named, default = _sparse(base_url, SPLADE), post(base_url, "/embed_sparse", {"inputs": TEXTS}).json()
    lexical = bge_m3_reference(folders["bge-m3"], TEXTS)["sparse"]
    assert [{e["index"] for e in row} for row in default] == [set(x) for x in lexical]
    splade = splade_reference(folders["splade"], TEXTS)
    assert [{e["index"] for e in row} for row in named] == [set(np.flatnonzero(r).tolist()) for r in splade]
    assert [{e["index"] for e in row} for row in named] != [set(x) for x in lexical]


def test_sparse_pruning_over_http(fleet):
    base_url, _folders = fleet
    full = _sparse(base_url, SPLADE)
    top = _sparse(base_url, SPLADE, top_k=5)
    cut = _sparse(base_url, SPLADE, threshold=0.2)
    for f, t, c in zip(full, top, cut):
        values = sorted((e["value"] for e in f), reverse=True)
        assert len(t) == min(5, len(f)) and sorted((e["value"] for e in t), reverse=True) == pytest.approx(values[:5])
        assert {e["index"] for e in c} == {e["index"] for e in f if e["value"] > 0.2}


def test_colbert_over_http_equals_multi_vector_encoder(fleet):
    base_url, folders = fleet
    for task in ("query", "document"):
        r = post(base_url, "/embed_all", {"model": "colbert", "inputs": TEXTS, "input_type": task})
        assert r.status_code == 200, r.text
        got = r.json()
        for vectors, expected in zip(got, colbert_reference(folders["colbert"], TEXTS, task)):
            vectors = np.asarray(vectors, np.float32)
            assert vectors.shape == expected.shape, task
            assert cosines(vectors, expected).min() >= COSINE


def test_bge_m3_three_outputs_over_http(fleet):
    base_url, folders = fleet
    ref = bge_m3_reference(folders["bge-m3"], TEXTS)
    r = post(base_url, "/v1/embeddings", {"model": "bge-m3", "input": TEXTS})
    assert r.status_code == 200, r.text
    dense = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
    assert cosines(dense, np.stack(ref["dense"])).min() >= COSINE
    for row, lexical in zip(_sparse(base_url, "bge-m3"), ref["sparse"]):
        assert {e["index"] for e in row} == set(lexical)
        np.testing.assert_allclose([e["value"] for e in row], [lexical[e["index"]] for e in row], atol=1e-4)
    r = post(base_url, "/embed_all", {"model": "bge-m3", "inputs": TEXTS})
    assert r.status_code == 200, r.text
    for vectors, expected in zip(r.json(), ref["colbert"]):
        vectors = np.asarray(vectors, np.float32)
        assert vectors.shape == expected.shape and cosines(vectors, expected).min() >= COSINE


def test_token_states_and_quantized_token_vectors(fleet):
    base_url, folders = fleet
    import torch
    from transformers import AutoModel, AutoTokenizer

    folder = folders["bge-m3"]
    r = post(base_url, "/embed_all", {"model": "bge-m3", "inputs": TEXTS[:2], "output": "tokens"})
    assert r.status_code == 200, r.text
    tokenizer, model = AutoTokenizer.from_pretrained(str(folder)), AutoModel.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        for text, states in zip(TEXTS[:2], r.json()):
            want = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].numpy()
            assert np.asarray(states).shape == want.shape and np.abs(np.asarray(states) - want).max() < 1e-4
    # token vectors in int8 and binary, made on the worker
    floats = [
        np.asarray(v, np.float32) for v in post(base_url, "/embed_all", {"model": "bge-m3", "inputs": TEXTS}).json()
    ]
    ints = post(base_url, "/embed_all", {"model": "bge-m3", "inputs": TEXTS, "embedding_type": "int8"})
    bits = post(base_url, "/embed_all", {"model": "bge-m3", "inputs": TEXTS, "embedding_type": "ubinary"})
    assert ints.status_code == 200 and bits.status_code == 200, ints.text + bits.text
    for f, i, b in zip(floats, ints.json(), bits.json()):
        assert cosines(np.asarray(i, np.float32), f).min() >= 0.99
        assert np.array_equal(np.unpackbits(np.asarray(b, np.uint8), axis=1)[:, : f.shape[1]], (f > 0).astype(np.uint8))


def test_outputs_a_model_lacks_are_refused_clearly(fleet):
    base_url, _ = fleet
    r = post(base_url, "/embed_sparse", {"model": "colbert", "inputs": ["x"]})
    assert r.status_code == 400 and "sparse" in r.json()["error"], r.text
    r = post(base_url, "/v1/embeddings", {"model": SPLADE, "input": ["x"]})
    assert r.status_code == 400 and "dense" in r.text, r.text
    r = post(base_url, "/embed_all", {"model": SPLADE, "inputs": ["x"], "output": "multivector"})
    assert r.status_code == 400 and "multi-vector" in r.text, r.text
    r = post(base_url, "/embed_sparse", {"model": SPLADE, "inputs": ["x"], "top_k": 0})
    assert r.status_code == 422 or r.status_code == 400, r.text
    assert "top_k" in r.text


def test_models_says_what_each_output_model_serves(fleet):
    """A model's ``kind`` in /v1/models is what it serves: a ColBERT-only model's is ``multivector``, not
    ``embedding`` (/v1/embeddings refuses it), a SPLADE's ``sparse``, BGE-M3's ``embedding`` (dense among
    its outputs); the live answer is held to its typed model."""
    from embedfleet.services.gateway.openai.answers import ModelList

    base_url, _ = fleet

    def listed() -> list[str]:
        return [m["id"] for m in httpx.get(f"{base_url}/v1/models", timeout=30).json()["data"]]

    wait_until(lambda: len(listed()) == 3, 60, "the three models listed")  # the gateway polls the fleet
    r = httpx.get(f"{base_url}/v1/models", timeout=30)
    assert r.status_code == 200, r.text
    cards = {card.id: card for card in ModelList.model_validate_json(r.content).data}
    assert {m: (c.kind, c.outputs) for m, c in cards.items()} == {
        "colbert": ("multivector", ["multivector"]),
        SPLADE: ("sparse", ["sparse"]),
        "bge-m3": ("embedding", ["dense", "sparse", "multivector"]),
    }
    r = post(base_url, "/v1/embeddings", {"model": "colbert", "input": ["x"]})
    assert r.status_code == 400 and "dense" in r.text, r.text
    r = post(base_url, "/embed_all", {"model": "colbert", "inputs": ["x"]})
    assert r.status_code == 200, r.text


def _reindex(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "embedfleet.services.cli", "reindex", *args], capture_output=True, text=True, timeout=120
    )


def test_bulk_jobs_write_sparse_and_multi_vector_rows(fleet, nats_url, tmp_path):
    """reindex --output sparse / multivector: every document's rows as the online routes give them."""
    import scipy.sparse

    base_url, _ = fleet
    texts = TEXTS * 5
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    common = ["--nats", nats_url, "--subject-prefix", PREFIX, "--batch-size", "7", "--quiet", "--stall-timeout", "60"]

    out = tmp_path / "sparse.npz"
    result = _reindex([str(docs), "--out", str(out), "--model", SPLADE, "--output", "sparse", *common])
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(out.with_suffix(".ids.json").read_text()) == [f"d{i}" for i in range(len(texts))]
    written = scipy.sparse.load_npz(out).toarray()
    online = _sparse(base_url, SPLADE)
    dim = written.shape[1]
    want = np.stack([densify([e["index"] for e in row], [e["value"] for e in row], dim) for row in online] * 5)
    assert np.array_equal(written > 0, want > 0)
    np.testing.assert_allclose(written, want, atol=1e-5)

    out = tmp_path / "colbert.npz"
    result = _reindex([str(docs), "--out", str(out), "--model", "colbert", "--output", "multivector", *common])
    assert result.returncode == 0, result.stdout + result.stderr
    stored = np.load(out)
    vectors, offsets = stored["vectors"], stored["offsets"]
    r = post(base_url, "/embed_all", {"model": "colbert", "inputs": TEXTS})
    online = [np.asarray(v, np.float32) for v in r.json()] * 5
    assert len(offsets) == len(texts) + 1
    for i, want_rows in enumerate(online):
        got = vectors[offsets[i] : offsets[i + 1]]
        assert got.shape == want_rows.shape and cosines(got, want_rows).min() >= COSINE

    refused = _reindex([str(docs), "--out", str(tmp_path / "x.npy"), "--model", SPLADE, "--output", "sparse", *common])
    assert refused.returncode != 0 and ".npz" in refused.stderr


def _http_job(base_url: str, job: str, model: str, output: str, texts: list[str]) -> tuple[list[str], dict, object]:
    """POST a job of ``output`` rows, wait until done, read it back: (ids in input order, NDJSON's
    id -> vector, the Parquet table)."""
    import io

    import pyarrow.parquet as pq

    from tests.support.procs import wait_until

    ids = [f"{job}-{i}" for i in range(len(texts))]
    r = post(
        base_url,
        "/v1/jobs",
        {
            "id": job,
            "model": model,
            "output": output,
            "batch_size": 3,
            "documents": [{"id": d, "text": t} for d, t in zip(ids, texts)],
        },
    )
    assert r.status_code == 202, r.text
    wait_until(lambda: httpx.get(f"{base_url}/v1/jobs/{job}", timeout=10).json().get("status") == "done", 120, job)
    lines = httpx.get(f"{base_url}/v1/jobs/{job}/results", timeout=60)
    assert lines.status_code == 200 and lines.headers["x-job-output"] == output, lines.text[:300]
    vectors = {line["id"]: line["vector"] for line in map(json.loads, lines.text.splitlines())}
    assert sorted(vectors) == sorted(ids)
    table = httpx.get(
        f"{base_url}/v1/jobs/{job}/results", headers={"accept": "application/vnd.apache.parquet"}, timeout=60
    )
    assert table.status_code == 200, table.text[:300]
    return ids, vectors, pq.read_table(io.BytesIO(table.content))


def _fetch(nats_url: str, job: str, out) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "embedfleet.services.cli",
            "jobs",
            "fetch",
            job,
            "--out",
            str(out),
            "--nats",
            nats_url,
            "--subject-prefix",
            PREFIX,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(out.with_suffix(".ids.json").read_text()) == [f"{job}-{i}" for i in range(len(TEXTS) * 2)]


def test_http_jobs_of_sparse_and_multi_vector_rows_read_back(fleet, nats_url, tmp_path):
    """POST /v1/jobs with output sparse / multivector, read back: GET /v1/jobs/{id}/results' NDJSON as the
    online routes answer, its Parquet the same rows, and `jobs fetch` the .npz reindex writes."""
    import scipy.sparse

    base_url, _ = fleet
    texts = TEXTS * 2
    ids, rows, table = _http_job(base_url, "outputs-sparse-http", SPLADE, "sparse", texts)
    dim = int(table.schema.metadata[b"dim"])
    dense = np.stack([densify(rows[d]["indices"], rows[d]["values"], dim) for d in ids])
    online = [densify([e["index"] for e in row], [e["value"] for e in row], dim) for row in _sparse(base_url, SPLADE)]
    want = np.stack(online * 2)
    assert np.array_equal(dense > 0, want > 0)
    np.testing.assert_allclose(dense, want, atol=1e-5)
    assert table.column("id").to_pylist() and sorted(table.column("id").to_pylist()) == sorted(ids)
    for r in table.to_pylist():  # float32 values, read back exactly from NDJSON's decimals
        assert r["vector"]["indices"] == rows[r["id"]]["indices"]
        np.testing.assert_array_equal(np.float32(r["vector"]["values"]), np.float32(rows[r["id"]]["values"]))
    _fetch(nats_url, "outputs-sparse-http", tmp_path / "sparse.npz")
    np.testing.assert_array_equal(scipy.sparse.load_npz(tmp_path / "sparse.npz").toarray(), dense)

    ids, rows, table = _http_job(base_url, "outputs-multi-http", "colbert", "multivector", texts)
    r = post(base_url, "/embed_all", {"model": "colbert", "inputs": TEXTS})
    online = [np.asarray(v, np.float32) for v in r.json()] * 2
    for doc, want_rows in zip(ids, online):
        got = np.asarray(rows[doc], np.float32)
        assert got.shape == want_rows.shape and cosines(got, want_rows).min() >= COSINE
    assert sorted(table.column("id").to_pylist()) == sorted(ids)
    for r in table.to_pylist():
        np.testing.assert_array_equal(np.float32(r["vector"]), np.float32(rows[r["id"]]))
    _fetch(nats_url, "outputs-multi-http", tmp_path / "multi.npz")
    stored = np.load(tmp_path / "multi.npz")
    vectors, offsets = stored["vectors"], stored["offsets"]
    for i, doc in enumerate(ids):
        np.testing.assert_array_equal(vectors[offsets[i] : offsets[i + 1]], np.asarray(rows[doc], np.float32))


def test_sparse_jobs_run_in_batches_whose_vectors_fit_a_message(fleet, nats_url, tmp_path):
    """SPLADE may weigh all 30,522 vocabulary ids: 64 documents' sparse vectors could take 15.6 MB, over
    the server's 8 MiB messages. reindex at the default --batch-size cuts the batches to 34 and says so,
    and every document is stored (none given up as a dead letter); POST /v1/jobs does the same."""
    import scipy.sparse

    base_url, _ = fleet
    texts = TEXTS * 20
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"s{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "sparse.npz"
    result = _reindex(
        [
            str(docs),
            "--out",
            str(out),
            "--model",
            SPLADE,
            "--output",
            "sparse",
            "--nats",
            nats_url,
            "--subject-prefix",
            PREFIX,
            "--quiet",
            "--stall-timeout",
            "120",
        ]
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(
        f"reindex: batch size cut from 64 to 34: a document's sparse vectors from {SPLADE} "
        "may take 244,188 bytes, and a batch's results must fit in one NATS message of "
        "8,388,608 bytes (max_payload)\n"
    ), result.stdout
    assert f"{len(texts)} documents in 3 batches" in result.stdout
    job = result.stdout.split("\njob ", 1)[1].split(":", 1)[0]
    assert scipy.sparse.load_npz(out).shape == (len(texts), 30522)
    state = httpx.get(f"{base_url}/v1/jobs/{job}", timeout=10).json()
    assert (state["status"], state["done"], state.get("failed", 0), state["batches"]) == ("done", len(texts), 0, 3), (
        state
    )

    body = {"model": SPLADE, "output": "sparse", "documents": [{"id": f"h{i}", "text": t} for i, t in enumerate(texts)]}
    r = post(base_url, "/v1/jobs", body)
    assert r.status_code == 202 and r.json()["batch_size"] == 34, r.text
    assert r.json()["note"].startswith("batch size cut from 64 to 34: a document's sparse vectors"), r.text
    job = r.json()["id"]
    deadline = time.monotonic() + 120
    while (state := httpx.get(f"{base_url}/v1/jobs/{job}", timeout=10).json())["status"] == "running":
        assert time.monotonic() < deadline, state
        time.sleep(0.5)
    assert (state["status"], state["done"], state.get("failed", 0), state["batches"]) == ("done", len(texts), 0, 3), (
        state
    )
