"""Reranking on real processes: TEI /rerank and Cohere/Jina /v1/rerank, with the bi-encoder (the
shared stack's scorer) and with a cross-encoder (its own stack: a BertForSequenceClassification
folder with random weights, built here), against sentence-transformers and transformers."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from embedfleet.services.gateway.cohere.answers import RerankV1Answer
from embedfleet.shared.nats.server import free_port
from tests.support.corpus import medium_texts, mixed_texts
from tests.support.procs import Service, count_services, healthy, wait_until

pytestmark = pytest.mark.integration

QUERY = "how do I read a file line by line"
TOLERANCE = 1e-4  # scores (cosine or logit) against the reference


def _check_ranking(indices: list[int], scores: list[float], want: np.ndarray, count: int) -> None:
    """Every candidate once (or the top ``count``), best first, each with the reference's score.
    (Order is checked through the scores: near-equal candidates may swap within the tolerance.)"""
    assert len(indices) == count and len(set(indices)) == count
    assert all(a >= b for a, b in itertools.pairwise(scores))
    np.testing.assert_allclose(scores, want[indices], atol=TOLERANCE)
    np.testing.assert_allclose(scores, np.sort(want)[::-1][:count], atol=TOLERANCE)


def _cosine_reference(reference, query: str, texts: list[str]) -> np.ndarray:
    q = reference.encode([query], normalize_embeddings=True)[0]
    c = reference.encode(texts, normalize_embeddings=True)
    return c @ q


def test_tei_rerank_with_the_bi_encoder(stack, reference):
    texts = mixed_texts(40)
    r = httpx.post(
        f"{stack.base_url}/rerank",
        json={"query": QUERY, "texts": texts, "return_text": True, "truncate": True},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    rows = r.json()
    want = _cosine_reference(reference, QUERY, texts)
    _check_ranking([row["index"] for row in rows], [row["score"] for row in rows], want, len(texts))
    assert all(row["text"] == texts[row["index"]] for row in rows)


def test_cohere_rerank_top_n_documents_and_errors(stack, reference):
    docs = mixed_texts(12)
    body = {
        "model": "all-MiniLM-L6-v2",
        "query": QUERY,
        "documents": [{"text": d} for d in docs],
        "top_n": 3,
        "return_documents": True,
    }
    r = httpx.post(f"{stack.base_url}/v1/rerank", json=body, timeout=60)
    assert r.status_code == 200, r.text
    RerankV1Answer.model_validate_json(r.content)  # the answer /openapi.json describes, strictly
    results = r.json()["results"]
    want = _cosine_reference(reference, QUERY, docs)
    _check_ranking([x["index"] for x in results], [x["relevance_score"] for x in results], want, 3)
    assert results[0]["document"] == {"text": docs[results[0]["index"]]}
    assert r.json()["model"] == "all-MiniLM-L6-v2"

    empty = httpx.post(f"{stack.base_url}/v1/rerank", json={"query": QUERY, "documents": []}, timeout=30)
    assert empty.status_code == 200 and empty.json()["results"] == []
    RerankV1Answer.model_validate_json(empty.content)
    bad = httpx.post(f"{stack.base_url}/v1/rerank", json={"query": "", "documents": ["a"]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "query"
    bad = httpx.post(f"{stack.base_url}/rerank", json={"query": "q", "texts": [1]}, timeout=30)
    assert bad.status_code == 400 and "texts[0]" in bad.json()["error"]  # TEI's error shape
    bad = httpx.post(f"{stack.base_url}/v1/rerank", json={"query": "q", "documents": ["a"], "top_n": 0}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_n"


def test_the_readmes_rerank_curl_runs_as_typed(stack, reference):
    """The README's "Rerank" curl through bash, its host swapped for the stack's: the document that answers
    the query first, with the reference's cosine for its score."""
    import json
    import re
    import subprocess

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\n## Rerank\n", 1)[1].split("\n## ", 1)[0]
    (command,) = re.findall(r"^curl -s localhost:8080/v1/rerank .*$", section, re.M)
    done = subprocess.run(
        ["bash", "-c", command.replace("localhost:8080", stack.base_url.removeprefix("http://"))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    sent = json.loads(re.search(r"-d '(.*)'$", command).group(1))
    answer = RerankV1Answer.model_validate_json(done.stdout)
    want = _cosine_reference(reference, sent["query"], sent["documents"])
    indices = [x.index for x in answer.results]
    _check_ranking(indices, [x.relevance_score for x in answer.results], want, sent["top_n"])
    assert "password" in sent["documents"][indices[0]]


def test_cosine_scores_stay_within_minus_one_and_one(stack):
    """A candidate equal to the query scores 1, never the 1.0000001 float32 rounding gives about a third
    of these texts unclipped (services/scorer/scoring.py)."""
    for query in mixed_texts(12):
        for path, rows, score in (
            ("/rerank", lambda b: b, "score"),
            ("/v1/rerank", lambda b: b["results"], "relevance_score"),
        ):
            key = "texts" if path == "/rerank" else "documents"
            r = httpx.post(
                f"{stack.base_url}{path}", json={"query": query, key: [query, QUERY], "truncate": True}, timeout=60
            )
            assert r.status_code == 200, r.text
            scores = [row[score] for row in rows(r.json())]
            assert all(-1.0 <= s <= 1.0 for s in scores) and scores[0] >= 1.0 - 1e-6, (path, query[:40], scores)


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory, nats_url, model_info) -> Iterator[tuple[str, Path]]:
    """A one-label BERT cross-encoder with random weights over the shipped model's vocabulary, served
    by its own tokenizer, worker, scorer and gateway (model name "tiny-reranker")."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    folder = tmp_path_factory.mktemp("reranker") / "tiny-reranker"
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=512,
        num_labels=1,
        initializer_range=0.2,
    )
    BertForSequenceClassification(config).eval().save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(model_info.path / name, folder / name)
    port = free_port()
    common = ["--nats", nats_url, "--model", str(folder), "--subject-prefix", "xenc"]
    logs = tmp_path_factory.mktemp("reranker-logs")
    services = [
        Service("tokenizer", [*common, "--chunk-seqs", "16"], logs),
        Service("worker", [*common, "--max-batch-tokens", "2048"], logs, {"OMP_NUM_THREADS": "1"}),
        Service("scorer", common, logs),
        Service("gateway", ["--nats", nats_url, "--subject-prefix", "xenc", "--port", str(port)], logs),
    ]
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: healthy(base) and count_services(nats_url, "scorer", prefix="xenc") == 1,
            120,
            "the cross-encoder stack",
            services,
        )
        yield base, folder
    finally:
        for s in services:
            s.stop()


def _cross_reference(folder: Path, query: str, texts: list[str]) -> np.ndarray:
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    tok = AutoTokenizer.from_pretrained(folder)
    model = BertForSequenceClassification.from_pretrained(folder).eval()
    batch = tok(
        [query] * len(texts), texts, padding=True, truncation="only_second", max_length=512, return_tensors="pt"
    )
    with torch.no_grad():
        return model(**batch).logits[:, 0].numpy()


def test_cross_encoder_scores_equal_transformers(cross_encoder):
    base, folder = cross_encoder
    # 60 candidates, split by the tokenizer into chunks of 16 pairs, some longer than the model's limit
    texts = mixed_texts(60)
    logits = _cross_reference(folder, QUERY, texts)
    assert np.ptp(logits) > 0.1  # scores differ, so the ordering means something

    raw = httpx.post(
        f"{base}/rerank", json={"query": QUERY, "texts": texts, "raw_scores": True, "truncate": True}, timeout=120
    )
    assert raw.status_code == 200, raw.text
    rows = raw.json()
    _check_ranking([row["index"] for row in rows], [row["score"] for row in rows], logits, len(texts))

    sig = httpx.post(f"{base}/v1/rerank", json={"query": QUERY, "documents": texts, "top_n": 5}, timeout=120)
    assert sig.status_code == 200, sig.text
    top = sig.json()["results"]
    _check_ranking([x["index"] for x in top], [x["relevance_score"] for x in top], 1 / (1 + np.exp(-logits)), 5)
    assert "document" not in top[0]


def test_cross_encoder_refuses_over_long_pairs_without_truncation(cross_encoder):
    base, _ = cross_encoder
    embed = httpx.post(f"{base}/v1/embeddings", json={"model": "tiny-reranker", "input": "a"}, timeout=30)
    assert embed.status_code == 400 and "cross-encoder" in embed.json()["error"]["message"], embed.text
    long_text = " ".join(["word"] * 2000)
    r = httpx.post(f"{base}/rerank", json={"query": QUERY, "texts": ["short", long_text]}, timeout=60)
    assert r.status_code == 413 and r.json()["error"].startswith("candidate 1 has "), r.text
    ok = httpx.post(
        f"{base}/rerank", json={"query": QUERY, "texts": ["short", long_text], "truncate": True}, timeout=60
    )
    assert ok.status_code == 200 and len(ok.json()) == 2


def test_a_cross_encoder_refuses_late_chunking(cross_encoder):
    """It has no token vectors to pool: 400 in the OpenAI shape, before any text is cut."""
    base, _ = cross_encoder
    r = httpx.post(
        f"{base}/v1/embeddings",
        json={"model": "tiny-reranker", "input": ["a long text"], "chunking": {"size": 64, "late": True}},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "chunking.late" and error["type"] == "invalid_request_error", error
    assert error["message"].startswith(
        "late chunking pools an embedder's token vectors; tiny-reranker is a cross-encoder"
    ), error


def test_an_over_long_query_is_named(stack):
    r = httpx.post(
        f"{stack.base_url}/rerank", json={"query": " ".join(["word"] * 600), "texts": ["a", "b"]}, timeout=60
    )
    assert r.status_code == 413, r.text
    assert r.json() == {
        "error": "the query has 602 tokens; the model's limit is 256 (send truncate=true to cut it)",
        "error_type": "Validation",
    }


def test_large_candidate_lists_are_split_and_merged(stack, reference):
    """200 candidates: scored in parts of 32 spread over both workers, merged in order."""
    texts = mixed_texts(200)
    r = httpx.post(f"{stack.base_url}/v1/rerank", json={"query": QUERY, "documents": texts, "top_n": 200}, timeout=120)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    _check_ranking(
        [x["index"] for x in results],
        [x["relevance_score"] for x in results],
        _cosine_reference(reference, QUERY, texts),
        200,
    )
    # without truncation, an over-long candidate is named by its index in the whole list
    texts = medium_texts(200)
    texts[150] = " ".join(["word"] * 600)
    refused = httpx.post(f"{stack.base_url}/rerank", json={"query": QUERY, "texts": texts}, timeout=120)
    assert refused.status_code == 413 and "candidate 150 has" in refused.json()["error"], refused.text
