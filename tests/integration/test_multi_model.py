"""Several models in one stack: ``embedfleet up --model A --model ID=B --model C`` starts a tokenizer
and a worker per model (and a scorer where it ranks) behind one gateway; each model answers by its
id on every route, /v1/models describes each, the TEI routes (no model name) use --default-model, an
unknown model gets 404 in each route's error shape, and /health?all=1 waits for every model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgpack
import numpy as np
import pytest

from embedfleet.shared.nats.server import free_port
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import medium_texts, mixed_texts
from tests.support.procs import Service, count_services, wait_until
from tests.support.tiny_models import build, hf_reference_logits, st_reference

pytestmark = pytest.mark.integration

PREFIX = "multimodel"
SECOND = "second"  # the id the Qwen2 embedder is served as (--model second=DIR), and --default-model


def _up_log(up: Service) -> str:
    return up.log()[-4000:]


@pytest.fixture(scope="module")
def fleet(nats_url: str, tmp_path_factory) -> Iterator[tuple[str, dict[str, Path], Service]]:
    root = tmp_path_factory.mktemp("multi-models")
    folders = {
        "bert": build("bert", root),
        SECOND: build("qwen2", root),  # another family, prompts, and another vocabulary (byte-level BPE)
        "bert-cls": build("bert", root, classifier=True, num_labels=1),
    }
    port = free_port()
    args = [
        "--nats",
        nats_url,
        "--data-dir",
        str(tmp_path_factory.mktemp("multi-data")),
        "--subject-prefix",
        PREFIX,
        "--port",
        str(port),
        "--default-model",
        SECOND,
        "--model",
        str(folders["bert"]),
        "--model",
        f"{SECOND}={folders[SECOND]}",
        "--model",
        str(folders["bert-cls"]),
    ]
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
    assert cards[SECOND]["prompts"]  # the Qwen2 folder has a query prompt

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
    r = httpx.post(
        f"{base}/v1/rerank",
        json={"model": "bert-cls", "query": query, "documents": docs, "top_n": len(docs)},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert sorted(x["index"] for x in results) == list(range(len(docs)))
    got = np.array([x["relevance_score"] for x in results])
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-logits[[x["index"] for x in results]])), atol=1e-4)
    assert list(got) == sorted(got, reverse=True)


def test_tei_embed_uses_the_default_model(fleet):
    """/embed names no model: --default-model (the Qwen2 folder served as 'second'), neither the first
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


# -- every route answers the model it names, not the default ------------------------------------------------

CROSS = "bert-cls"
QUERY = "how do I read a file line by line"


@pytest.fixture(scope="module")
def refs(fleet) -> dict:
    """References of the module's texts: each embedder's vectors, the cross-encoder's logits, each tokenizer."""
    from tokenizers import Tokenizer

    _, folders, _ = fleet
    texts, docs = mixed_texts(6), medium_texts(8)
    vectors = {name: st_reference(folders[name], texts) for name in ("bert", SECOND)}
    doc_vectors = {name: st_reference(folders[name], [QUERY, *docs]) for name in ("bert", SECOND)}
    # the named model and the default answer apart, so a route that answered the default would fail
    assert cosines(vectors["bert"], vectors[SECOND]).max() < 0.99
    return {
        "texts": texts,
        "docs": docs,
        "vectors": vectors,
        "doc_vectors": doc_vectors,
        "logits": hf_reference_logits(folders[CROSS], [(QUERY, d) for d in docs])[:, 0],
        "tokenizers": {name: Tokenizer.from_file(str(folders[name] / "tokenizer.json")) for name in ("bert", SECOND)},
    }


def _ok(base: str, path: str, body: dict, **kw) -> httpx.Response:
    r = httpx.post(f"{base}{path}", json=body, timeout=120, **kw)
    assert r.status_code == 200, (path, r.text)
    return r


def _is_berts(got: np.ndarray, refs: dict) -> None:
    """``got`` holds bert's vectors of the module's texts, not those of the default model."""
    got = np.asarray(got, np.float32)
    assert got.shape == refs["vectors"]["bert"].shape
    assert cosines(got, refs["vectors"]["bert"]).min() >= COSINE_TOLERANCE


def _cosine_scores(refs: dict, name: str) -> np.ndarray:
    v = refs["doc_vectors"][name]
    return cosines(v[1:], np.repeat(v[:1], len(v) - 1, axis=0))


def _ranked(rows: list[dict], key: str) -> np.ndarray:
    """Scores of a ranking, back in input order."""
    scores = np.empty(len(rows))
    for row in rows:
        scores[row["index"]] = row[key]
    return scores


@pytest.mark.parametrize("path", ["/v1/embeddings", "/embeddings"])
def test_openai_routes_answer_the_named_model(fleet, refs, path):
    base, _, _ = fleet
    r = _ok(base, path, {"model": "bert", "input": refs["texts"]})
    assert r.json()["model"] == "bert"
    _is_berts([d["embedding"] for d in r.json()["data"]], refs)


def test_tei_embed_answers_the_named_model(fleet, refs):
    base, _, _ = fleet
    _is_berts(_ok(base, "/embed", {"model": "bert", "inputs": refs["texts"]}).json(), refs)
    packed = msgpack.unpackb(
        _ok(
            base, "/embed", {"model": "bert", "inputs": refs["texts"]}, headers={"accept": "application/msgpack"}
        ).content
    )
    assert packed["model"] == "bert"
    _is_berts(np.frombuffer(packed["data"], packed["dtype"]).reshape(packed["shape"]), refs)


@pytest.mark.parametrize("path", ["/v1/embed", "/v2/embed"])
def test_cohere_embed_answers_the_named_model(fleet, refs, path):
    base, _, _ = fleet
    body = _ok(base, path, {"model": "bert", "texts": refs["texts"], "embedding_types": ["float"]}).json()
    _is_berts(body["embeddings"]["float"], refs)


def test_similarity_answers_the_named_model(fleet, refs):
    base, _, _ = fleet
    texts = refs["texts"]
    got = _ok(
        base, "/similarity", {"model": "bert", "inputs": {"source_sentence": texts[0], "sentences": texts[1:]}}
    ).json()
    want = {name: cosines(v[1:], np.repeat(v[:1], len(v) - 1, axis=0)) for name, v in refs["vectors"].items()}
    assert np.abs(want["bert"] - want[SECOND]).max() > 0.05  # the default's cosines are others
    np.testing.assert_allclose(got, want["bert"], atol=1e-4)


def test_embed_all_answers_the_named_models_token_states(fleet, refs):
    import torch
    from transformers import AutoModel, AutoTokenizer

    base, folders, _ = fleet
    texts = refs["texts"][:3]
    got = _ok(base, "/embed_all", {"model": "bert", "inputs": texts, "output": "tokens"}).json()
    tokenizer, model = (
        AutoTokenizer.from_pretrained(str(folders["bert"])),
        AutoModel.from_pretrained(str(folders["bert"])).eval(),
    )
    with torch.no_grad():
        for text, states in zip(texts, got):
            want = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].numpy()
            assert np.asarray(states).shape == want.shape and np.abs(np.asarray(states) - want).max() < 1e-4
    default = _ok(base, "/embed_all", {"inputs": texts, "output": "tokens"}).json()
    assert [np.shape(s) for s in default] != [np.shape(s) for s in got]  # another vocabulary: other token counts


def test_embed_sparse_weighs_the_named_model(fleet):
    """No model here makes sparse vectors: the refusal names the model asked for (test_outputs checks
    the vectors of a named sparse model against another default)."""
    base, _, _ = fleet
    r = httpx.post(f"{base}/embed_sparse", json={"model": "bert", "inputs": ["x"]}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json() == {
        "error": "bert makes no sparse vectors (serve a SPLADE or BGE-M3 model)",
        "error_type": "Validation",
    }


@pytest.mark.parametrize("name", ["bert", SECOND])
def test_tokenize_and_decode_use_the_named_models_tokenizer(fleet, refs, name):
    base, _, _ = fleet
    texts, tokenizer = refs["texts"], refs["tokenizers"][name]
    other = refs["tokenizers"]["bert" if name == SECOND else SECOND]
    want = [e.ids for e in tokenizer.encode_batch(texts)]
    assert want != [e.ids for e in other.encode_batch(texts)]
    tokens = _ok(base, "/tokenize", {"model": name, "inputs": texts}).json()
    assert [[t["id"] for t in row] for row in tokens] == want
    ids = [e.ids for e in refs["tokenizers"]["bert"].encode_batch(texts)]  # the same IDs, read by each vocabulary
    assert tokenizer.decode_batch(ids) != other.decode_batch(ids)
    assert _ok(base, "/decode", {"model": name, "ids": ids}).json() == tokenizer.decode_batch(ids)


def test_tei_rerank_scores_with_the_named_model(fleet, refs):
    base, _, _ = fleet
    body = {"query": QUERY, "texts": refs["docs"]}
    logits = refs["logits"]
    cross = _ranked(_ok(base, "/rerank", {**body, "model": CROSS}).json(), "score")
    np.testing.assert_allclose(cross, 1 / (1 + np.exp(-logits)), atol=1e-4)  # the cross-encoder's, not cosines
    raw = _ranked(_ok(base, "/rerank", {**body, "model": CROSS, "raw_scores": True}).json(), "score")
    np.testing.assert_allclose(raw, logits, atol=1e-4)
    cosine = _ranked(_ok(base, "/rerank", {**body, "model": "bert"}).json(), "score")
    assert np.abs(_cosine_scores(refs, "bert") - _cosine_scores(refs, SECOND)).max() > 0.05
    np.testing.assert_allclose(cosine, _cosine_scores(refs, "bert"), atol=1e-4)


def test_cohere_and_jina_rerank_score_with_the_named_model(fleet, refs):
    base, _, _ = fleet
    body = {"query": QUERY, "documents": refs["docs"], "top_n": len(refs["docs"])}
    v2 = _ranked(_ok(base, "/v2/rerank", {**body, "model": CROSS}).json()["results"], "relevance_score")
    np.testing.assert_allclose(v2, 1 / (1 + np.exp(-refs["logits"])), atol=1e-4)
    for path in ("/v1/rerank", "/v2/rerank"):
        cosine = _ranked(_ok(base, path, {**body, "model": "bert"}).json()["results"], "relevance_score")
        np.testing.assert_allclose(cosine, _cosine_scores(refs, "bert"), atol=1e-4)


def test_predict_scores_with_the_named_model(fleet, refs):
    base, _, _ = fleet
    pairs = [[QUERY, d] for d in refs["docs"][:3]]
    got = _ok(base, "/predict", {"model": CROSS, "inputs": pairs}).json()
    assert [[p["label"] for p in row] for row in got] == [["LABEL_0"]] * 3
    np.testing.assert_allclose([row[0]["score"] for row in got], 1 / (1 + np.exp(-refs["logits"][:3])), atol=1e-4)
    refused = httpx.post(f"{base}/predict", json={"inputs": pairs}, timeout=60)  # the default is an embedder
    assert refused.status_code == 400 and refused.json()["error"].startswith(f"{SECOND} is not a sequence classifier")


@pytest.mark.parametrize("path", ["/", "/invocations"])
def test_root_runs_the_named_models_task(fleet, refs, path):
    base, _, _ = fleet
    ranked = _ranked(_ok(base, path, {"model": CROSS, "query": QUERY, "texts": refs["docs"]}).json(), "score")
    np.testing.assert_allclose(ranked, 1 / (1 + np.exp(-refs["logits"])), atol=1e-4)
    _is_berts(_ok(base, path, {"model": "bert", "inputs": refs["texts"]}).json(), refs)


def test_info_describes_the_model_of_its_query(fleet):
    base, folders, _ = fleet

    def info(query: str) -> dict:
        r = httpx.get(f"{base}/info{query}", timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    cross = info(f"?model={CROSS}")
    assert cross["model_id"] == CROSS
    assert cross["model_type"] == {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
    assert (
        cross["max_input_length"] == json.loads((folders[CROSS] / "config.json").read_text())["max_position_embeddings"]
    )
    bert = info("?model=bert")
    assert (bert["model_id"], bert["model_type"]) == ("bert", {"embedding": {"pooling": "mean"}})
    assert (
        bert["max_input_length"]
        == json.loads((folders["bert"] / "sentence_bert_config.json").read_text())["max_seq_length"]
    )
    assert info("")["model_id"] == SECOND


# every route, with a body it would otherwise answer; the error in the route's own shape
_OPENAI_404 = ["/v1/embeddings", "/embeddings", "/v1/rerank", "/v1/jobs"]
_COHERE_404 = ["/v1/embed", "/v2/embed", "/v2/rerank"]
_BODIES = {
    "/v1/embeddings": {"input": "x"},
    "/embeddings": {"input": "x"},
    "/v1/rerank": {"query": "q", "documents": ["a"]},
    "/v1/jobs": {"documents": [{"id": "a", "text": "x"}]},
    "/v1/embed": {"texts": ["x"]},
    "/v2/embed": {"texts": ["x"]},
    "/v2/rerank": {"query": "q", "documents": ["a"]},
    "/embed": {"inputs": "x"},
    "/embed_sparse": {"inputs": "x"},
    "/embed_all": {"inputs": "x"},
    "/tokenize": {"inputs": "x"},
    "/rerank": {"query": "q", "texts": ["a"]},
    "/predict": {"inputs": "x"},
    "/similarity": {"inputs": {"source_sentence": "a", "sentences": ["b"]}},
    "/decode": {"ids": [1, 2]},
    "/": {"inputs": "x"},
    "/invocations": {"inputs": "x"},
}


@pytest.mark.parametrize("path", list(_BODIES))
def test_an_unknown_model_is_404_on_every_route(fleet, path):
    base, folders, _ = fleet
    message = f"model 'missing' is not served here; available: {', '.join(sorted(folders))}"
    r = httpx.post(f"{base}{path}", json={**_BODIES[path], "model": "missing"}, timeout=60)
    assert r.status_code == 404, r.text
    if path in _OPENAI_404:
        want = {
            "error": {"message": message, "type": "invalid_request_error", "param": "model", "code": "model_not_found"}
        }
    elif path in _COHERE_404:
        want = {"message": message}
    else:
        want = {"error": message, "error_type": "Validation"}
    assert r.json() == want


@pytest.mark.parametrize("path", ["/v1/jobs", "/embed", "/rerank", "/tokenize"])
def test_a_model_that_is_no_string_is_refused_not_taken_for_the_default(fleet, path):
    base, _, _ = fleet
    r = httpx.post(f"{base}{path}", json={**_BODIES[path], "model": 5}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if path == "/v1/jobs":  # OpenAI's error shape, the field named
        assert (error["message"], error["param"]) == ("'model' must be a string, got 5", "model")
    else:  # TEI's
        assert error == "'model' must be a string, got 5"


def test_info_of_an_unknown_model_is_404(fleet):
    base, folders, _ = fleet
    r = httpx.get(f"{base}/info", params={"model": "missing"}, timeout=30)
    assert r.status_code == 404, r.text
    assert r.json() == {
        "error": f"model 'missing' is not served here; available: {', '.join(sorted(folders))}",
        "error_type": "Validation",
    }


# -- readiness of every model: last, as it adds a model to the fleet and takes it away -------------------


def _health(base: str, query: str = "") -> tuple[int, dict]:
    r = httpx.get(f"{base}/health{query}", timeout=30)
    return r.status_code, r.json()


def test_health_all_waits_for_every_model(fleet, nats_url, tmp_path):
    """A model whose tokenizer answers and whose worker does not yet (as while ``up`` starts the workers
    one at a time): /health stays 200, /health?all=1 and ?model=ID answer 503 naming it until its
    worker answers."""
    base, folders, _ = fleet
    served = sorted(folders)
    assert _health(base, "?all=1") == (200, {"status": "ok", "models": served})
    model = ["--nats", nats_url, "--subject-prefix", PREFIX, "--model", str(folders["bert"]), "--model-name", "late"]
    tokenizer = Service("tokenizer", model, tmp_path)
    worker = None
    try:
        wait_until(lambda: _health(base, "?all=1")[0] == 503, 60, "the late model's tokenizer", [tokenizer])
        status, body = _health(base, "?all=1")
        assert (status, body["waiting"], body["tokenizers"], body["workers"]) == (
            503,
            ["late"],
            sorted([*served, "late"]),
            served,
        )
        assert (
            body["error"] == "not served yet (a tokenizer and a worker each): late"
            and body["error_type"] == "Unhealthy"
        )
        status, body = _health(base)  # liveness: some model is served (those whose processes answered first)
        assert (status, body["status"]) == (200, "ok") and set(body["models"]) <= set(served), body
        assert _health(base, "?model=late&model=bert")[1]["waiting"] == ["late"]
        assert _health(base, "?model=bert&model=second") == (200, {"status": "ok", "models": served})

        worker = Service("worker", [*model, "--max-batch-tokens", "1024"], tmp_path, {"OMP_NUM_THREADS": "1"})
        wait_until(lambda: _health(base, "?all=1")[0] == 200, 120, "the late model's worker", [tokenizer, worker])
        assert _health(base, "?all=1") == (200, {"status": "ok", "models": sorted([*served, "late"])})
        assert _health(base, "?model=late")[0] == 200
    finally:
        for s in (worker, tokenizer):
            if s is not None:
                s.stop()
    wait_until(lambda: _health(base, "?all=1") == (200, {"status": "ok", "models": served}), 60, "the late model gone")
