"""TEI's task routes through the whole stack: /predict, /similarity, /decode, and POST / by the model's
kind, with huggingface_hub's InferenceClient where it has a call for the route.

The embedder is the default stack's all-MiniLM-L6-v2 (reference: sentence-transformers on the same
folder). The classifier, reranker and SPLADE model are tiny random checkpoints served by a fleet of
their own (own subject prefix, own gateway): references transformers' logits and SparseEncoder.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from embedfleet.services.gateway.http.health_answers import Healthy
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import medium_texts, mixed_texts
from tests.support.output_models import build_splade, densify, splade_reference
from tests.support.procs import Service, post, running_fleet, wait_until
from tests.support.tiny_models import build, hf_reference_logits

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"
PREFIX = "tei-tasks"
CLASSIFIER, RERANKER, SPLADE = "cls3", "rerank1", "splade"  # served ids; the classifier sorts first: the default
LABELS = ["negative", "neutral", "positive"]
TEXTS = ["hello world, a test!", "the quick brown fox jumps over the lazy dog.", "x", "search is fun " * 40]


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits.astype(np.float64) - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# -- the embedder of the default stack ------------------------------------------------------------------


def test_feature_extraction_equals_sentence_transformers(stack, reference):
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=stack.base_url)
    texts = mixed_texts(12)
    got = client.feature_extraction(texts, truncate=True)  # POST / with {"inputs", "truncate"}
    want = reference.encode(texts, convert_to_numpy=True)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert cosines(got, want).min() >= COSINE_TOLERANCE
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # TEI's default: normalised
    one = client.feature_extraction("a single text", normalize=False)
    assert one.shape == (1, want.shape[1])
    assert cosines(one, reference.encode(["a single text"])).min() >= COSINE_TOLERANCE
    assert abs(np.linalg.norm(one) - 1.0) > 1e-3  # normalize=False was honoured: the raw pooled vector
    r = httpx.post(
        stack.base_url, json={"inputs": "search is fun " * 300}, timeout=60
    )  # TEI: truncate defaults to false
    assert r.status_code == 413 and r.json()["error_type"] == "Validation", r.text


def test_sentence_similarity_equals_cosines_of_reference_vectors(stack, reference):
    from huggingface_hub import InferenceClient

    source, others = "How do I read a file line by line?", [*medium_texts(6), "reading files one line at a time"]
    vectors = reference.encode([source, *others], convert_to_numpy=True)
    want = cosines(np.repeat(vectors[:1], len(others), axis=0), vectors[1:])
    assert np.ptp(want) > 0.1
    got = InferenceClient(base_url=stack.base_url).sentence_similarity(source, other_sentences=others)  # POST /
    np.testing.assert_allclose(got, want, atol=1e-4)
    body = {"inputs": {"source_sentence": source, "sentences": others}, "parameters": {"truncate": True}}
    np.testing.assert_allclose(post(stack.base_url, "/similarity", body, 200).json(), want, atol=1e-4)
    refused = post(stack.base_url, "/similarity", {"inputs": {"source_sentence": source, "sentences": []}}, 400).json()
    assert refused == {"error": "'inputs.sentences' must not be an empty list", "error_type": "Validation"}


def test_decode_equals_the_tokenizers_library(stack, model_info):
    tokenizer = Tokenizer.from_file(str(model_info.path / "tokenizer.json"))
    texts = [*mixed_texts(10)[:9], "Une phrase en français, avec des accents: é è à."]
    ids = [e.ids for e in tokenizer.encode_batch(texts)]
    for skip in (True, False):
        got = post(stack.base_url, "/decode", {"ids": ids, "skip_special_tokens": skip}, 200).json()
        assert got == tokenizer.decode_batch(ids, skip_special_tokens=skip)
    assert post(stack.base_url, "/decode", {"ids": ids[0]}, 200).json() == [
        tokenizer.decode(ids[0])
    ]  # one sequence, TEI's default
    tokens = post(stack.base_url, "/tokenize", {"inputs": "hello world"}, 200).json()[0]
    assert post(stack.base_url, "/decode", {"ids": [t["id"] for t in tokens]}, 200).json() == ["hello world"]
    refused = post(stack.base_url, "/decode", {"ids": []}, 400).json()
    assert refused["error_type"] == "Validation" and "empty" in refused["error"]
    assert post(stack.base_url, "/decode", {"ids": [1, -1]}, 422).json()["error_type"] == "Validation"


def test_root_embeds_with_an_embedder_and_health_answers_on_get(stack):
    body = {"inputs": TEXTS, "truncate": True, "dimensions": 64}
    root = np.array(post(stack.base_url, "/", body, 200).json(), np.float32)
    embed = np.array(post(stack.base_url, "/embed", body, 200).json(), np.float32)
    assert root.shape == (len(TEXTS), 64)
    assert cosines(root, embed).min() >= COSINE_TOLERANCE
    assert (
        cosines(np.array(post(stack.base_url, "/invocations", body, 200).json(), np.float32), embed).min()
        >= COSINE_TOLERANCE
    )
    r = httpx.post(stack.base_url, json=body, headers={"accept": "application/octet-stream"}, timeout=60)
    assert r.status_code == 200 and r.headers["x-embedding-dim"] == "64"
    assert cosines(np.frombuffer(r.content, "<f4").reshape(len(TEXTS), 64), embed).min() >= COSINE_TOLERANCE
    for path in ("/", "/ping"):
        r = httpx.get(f"{stack.base_url}{path}", timeout=30)
        assert r.status_code == 200 and r.json()["status"] == "ok", r.text
        Healthy.model_validate_json(r.content)  # /health's answer, as documented
    refused = post(
        stack.base_url, "/", {"query": "q", "texts": ["a"]}, 400
    ).json()  # an embedder's root embeds: rerank elsewhere
    assert refused == {"error": "'inputs' is required", "error_type": "Validation"}
    refused = post(stack.base_url, "/predict", {"inputs": "a"}, 400).json()
    assert refused["error_type"] == "Validation" and "not a sequence classifier" in refused["error"]


# -- a classifier, a reranker and a SPLADE model --------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(nats_url: str, tmp_path_factory) -> Iterator[tuple[str, dict]]:
    root = tmp_path_factory.mktemp("tei-task-models")
    folders = {
        CLASSIFIER: build("bert", root / "three", classifier=True, num_labels=3),
        RERANKER: build("bert", root / "one", classifier=True, num_labels=1),
        SPLADE: build_splade(root / "sparse"),
    }
    config = json.loads((folders[CLASSIFIER] / "config.json").read_text())
    config |= {"id2label": dict(enumerate(LABELS)), "label2id": {name: i for i, name in enumerate(LABELS)}}
    (folders[CLASSIFIER] / "config.json").write_text(json.dumps(config))
    log_dir = tmp_path_factory.mktemp("tei-task-logs")
    scorer = Service(
        "scorer",
        ["--nats", nats_url, "--subject-prefix", PREFIX, "--model", str(folders[RERANKER]), "--model-name", RERANKER],
        log_dir,
    )
    with running_fleet(nats_url, PREFIX, folders, log_dir, named=True, extra=[scorer]) as (base_url, services):
        # ?all=1: every model served (a plain /health lists the models whose processes answered first)
        wait_until(
            lambda: len(httpx.get(f"{base_url}/health?all=1", timeout=5).json().get("models", [])) == len(folders),
            60,
            "every model served",
            services,
        )
        yield base_url, folders


def test_predict_equals_transformers_softmax(fleet):
    base_url, folders = fleet
    queries = medium_texts(5)
    pairs = [(q, d) for q, d in zip(queries, medium_texts(10)[5:])]
    logits = {
        "single": hf_reference_logits(folders[CLASSIFIER], queries),
        "pair": hf_reference_logits(folders[CLASSIFIER], pairs),
    }
    assert np.ptp(_softmax(logits["single"]), axis=1).min() > 1e-3  # the labels' order is not a tie

    def check(predictions: list[dict], row: np.ndarray, raw: bool = False) -> None:
        want = row.astype(np.float64) if raw else _softmax(row[None])[0]
        assert [p["label"] for p in predictions] == [LABELS[i] for i in np.argsort(-want)]
        np.testing.assert_allclose([p["score"] for p in predictions], np.sort(want)[::-1], atol=1e-4)

    one = post(base_url, "/predict", {"inputs": queries[0], "model": CLASSIFIER, "truncate": True}, 200).json()
    check(one, logits["single"][0])
    check(post(base_url, "/predict", {"inputs": list(pairs[1]), "model": CLASSIFIER}, 200).json(), logits["pair"][1])
    batch = [[q] for q in queries] + [list(p) for p in pairs]  # texts and pairs mixed: both kinds of request
    got = post(base_url, "/predict", {"inputs": batch, "model": CLASSIFIER, "truncate": True}, 200).json()
    assert len(got) == len(batch)
    for predictions, row in zip(got, [*logits["single"], *logits["pair"]]):
        check(predictions, row)
    raw = post(
        base_url, "/predict", {"inputs": [[q] for q in queries], "raw_scores": True, "model": CLASSIFIER}, 200
    ).json()
    for predictions, row in zip(raw, logits["single"]):
        check(predictions, row, raw=True)
    # POST / of a classifier predicts, as TEI's; the classifier is the default model here
    check(post(base_url, "/", {"inputs": queries[0]}, 200).json(), logits["single"][0])
    info = httpx.get(f"{base_url}/info", timeout=30).json()
    assert info["model_id"] == CLASSIFIER
    assert info["model_type"] == {
        "classifier": {
            "id2label": {str(i): n for i, n in enumerate(LABELS)},
            "label2id": {n: i for i, n in enumerate(LABELS)},
        }
    }


def test_root_of_a_reranker_reranks_and_predict_gives_its_sigmoid(fleet):
    base_url, folders = fleet
    query, docs = "how do I read a file line by line", medium_texts(8)
    logits = hf_reference_logits(folders[RERANKER], [(query, d) for d in docs])[:, 0]
    assert np.ptp(logits) > 0.1
    ranked = post(base_url, "/", {"query": query, "texts": docs, "model": RERANKER, "return_text": True}, 200).json()
    assert [r["index"] for r in ranked] == np.argsort(-logits, kind="stable").tolist()
    np.testing.assert_allclose([r["score"] for r in ranked], 1 / (1 + np.exp(-np.sort(logits)[::-1])), atol=1e-4)
    assert [r["text"] for r in ranked] == [docs[r["index"]] for r in ranked]
    raw = post(base_url, "/", {"query": query, "texts": docs, "model": RERANKER, "raw_scores": True}, 200).json()
    np.testing.assert_allclose([r["score"] for r in raw], np.sort(logits)[::-1], atol=1e-4)
    predicted = post(base_url, "/predict", {"inputs": [[query, d] for d in docs[:3]], "model": RERANKER}, 200).json()
    for predictions, logit in zip(predicted, logits[:3]):
        assert [p["label"] for p in predictions] == ["LABEL_0"]
        assert abs(predictions[0]["score"] - 1 / (1 + np.exp(-logit))) < 1e-4
    refused = post(
        base_url, "/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "model": RERANKER}, 400
    ).json()
    assert "cross-encoder" in refused["error"] and refused["error_type"] == "Validation"


def test_root_of_a_splade_model_embeds_sparse(fleet):
    base_url, folders = fleet
    ref = splade_reference(folders[SPLADE], TEXTS)
    rows = post(base_url, "/", {"inputs": TEXTS, "model": SPLADE, "truncate": True}, 200).json()
    assert rows == post(base_url, "/embed_sparse", {"inputs": TEXTS, "model": SPLADE, "truncate": True}, 200).json()
    got = np.stack([densify([e["index"] for e in row], [e["value"] for e in row], ref.shape[1]) for row in rows])
    assert np.array_equal(got > 0, ref > 0) and cosines(got, ref).min() >= COSINE_TOLERANCE


def test_decode_with_another_models_tokenizer(fleet):
    base_url, folders = fleet
    tokenizer = Tokenizer.from_file(str(folders[CLASSIFIER] / "tokenizer.json"))
    ids = [e.ids for e in tokenizer.encode_batch(TEXTS)]
    assert post(base_url, "/decode", {"ids": ids, "model": CLASSIFIER}, 200).json() == tokenizer.decode_batch(ids)
