"""Several models in one stack: ``embedfleet up --model A --model ID=B --model C`` starts a tokenizer
and a worker per model (and a scorer where it ranks) behind one gateway; each model answers by its
id, /v1/models describes each, and the TEI routes (no model name) use --default-model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest

from shared.nats_server import free_port
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.corpus import medium_texts, mixed_texts
from tests.integration.procs import Service, count_services, wait_until
from tests.tiny_models import build, hf_reference_logits, st_reference

pytestmark = pytest.mark.integration

PREFIX = "multimodel"
SECOND = "second"  # the id the Qwen3 embedder is served as (--model second=DIR), and --default-model


def _up_log(up: Service) -> str:
    return up.log()[-4000:]


@pytest.fixture(scope="module")
def fleet(nats_url: str, tmp_path_factory) -> Iterator[tuple[str, dict[str, Path], Service]]:
    root = tmp_path_factory.mktemp("multi-models")
    folders = {
        "bert": build("bert", root),
        SECOND: build("qwen3", root),  # another family, and prompts
        "bert-cls": build("bert", root, classifier=True, num_labels=1),
    }
    port = free_port()
    args = ["--nats", nats_url, "--subject-prefix", PREFIX, "--port", str(port), "--default-model", SECOND,
            "--model", str(folders["bert"]), "--model", f"{SECOND}={folders[SECOND]}", "--model", str(folders["bert-cls"])]
    # a fixed engine budget, inherited by the three workers: test_up runs the start-up calibration
    up = Service("up", args, tmp_path_factory.mktemp("multi-logs"), {"EMBEDFLEET_MAX_BATCH_TOKENS": "1024"})
    try:
        wait_until(lambda: "embedfleet is up" in up.log(), 300, "the stack", [up])
        yield f"http://127.0.0.1:{port}", folders, up
    finally:
        code = up.stop(60)
        assert code == 0, _up_log(up)


def test_each_model_gets_its_processes(fleet, nats_url):
    _, folders, up = fleet
    assert count_services(nats_url, "tokenizer", prefix=PREFIX) == 3
    assert count_services(nats_url, "worker", prefix=PREFIX) == 3
    # the cross-encoder's scores, and cosine for each dense embedder
    assert count_services(nats_url, "scorer", prefix=PREFIX) == 3
    assert all(name in up.log() for name in folders)  # the banner names every model


def test_models_lists_each_with_its_kind_and_limits(fleet):
    base, folders, _ = fleet
    r = httpx.get(f"{base}/v1/models", timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list"
    cards = {m["id"]: m for m in body["data"]}
    assert set(cards) == set(folders)
    for card in cards.values():
        assert (card["object"], card["owned_by"]) == ("model", "embedfleet") and isinstance(card["created"], int)

    for name in ("bert", SECOND):
        folder = folders[name]
        st_config = json.loads((folder / "sentence_bert_config.json").read_text())
        prompts = json.loads((folder / "config_sentence_transformers.json").read_text()).get("prompts", {})
        assert cards[name]["kind"] == "embedding"
        assert cards[name]["dimensions"] == st_reference(folder, ["x"]).shape[1]
        assert cards[name]["max_tokens"] == st_config["max_seq_length"]
        assert sorted(cards[name]["prompts"]) == sorted(prompts)
        assert cards[name]["outputs"] == ["dense"]
    assert cards[SECOND]["prompts"]  # the Qwen3 folder has query / document prompts

    config = json.loads((folders["bert-cls"] / "config.json").read_text())
    assert cards["bert-cls"]["kind"] == "rerank"
    assert cards["bert-cls"]["dimensions"] == len(config["id2label"]) == 1
    assert cards["bert-cls"]["max_tokens"] == config["max_position_embeddings"]
    assert [c["id"] for c in body["data"] if c["default"]] == [SECOND]


@pytest.mark.parametrize("name", ["bert", SECOND])
def test_each_embedder_answers_by_its_name(fleet, name):
    base, folders, _ = fleet
    texts = mixed_texts(16)
    r = httpx.post(f"{base}/v1/embeddings", json={"model": name, "input": texts}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == name
    got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
    want = st_reference(folders[name], texts)
    assert got.shape == want.shape
    c = cosines(got, want)
    assert c.min() >= COSINE_TOLERANCE, f"{name}: worst cosine {c.min():.6f} at {c.argmin()}"


def test_the_cross_encoder_reranks_by_its_name(fleet):
    base, folders, _ = fleet
    query, docs = "how do I read a file line by line", medium_texts(12)
    logits = hf_reference_logits(folders["bert-cls"], [(query, d) for d in docs])[:, 0]
    assert np.ptp(logits) > 0.1
    r = httpx.post(f"{base}/v1/rerank", json={"model": "bert-cls", "query": query, "documents": docs, "top_n": len(docs)},
                   timeout=120)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert sorted(x["index"] for x in results) == list(range(len(docs)))
    got = np.array([x["relevance_score"] for x in results])
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-logits[[x["index"] for x in results]])), atol=1e-4)
    assert list(got) == sorted(got, reverse=True)


def test_tei_embed_uses_the_default_model(fleet):
    """/embed names no model: --default-model (the Qwen3 folder served as 'second'), neither the first
    --model given nor the first id in order."""
    base, folders, _ = fleet
    texts = mixed_texts(6)
    r = httpx.post(f"{base}/embed", json={"inputs": texts}, timeout=120)
    assert r.status_code == 200, r.text
    got = np.array(r.json(), np.float32)
    assert cosines(got, st_reference(folders[SECOND], texts)).min() >= COSINE_TOLERANCE
    bert = st_reference(folders["bert"], texts)
    assert got.shape[1] != bert.shape[1] or cosines(got, bert).max() < 0.99


def test_an_unknown_model_lists_the_served_ones(fleet):
    base, folders, _ = fleet
    r = httpx.post(f"{base}/v1/embeddings", json={"model": "missing", "input": "x"}, timeout=30)
    assert r.status_code == 404, r.text
    assert all(name in r.text for name in folders)
