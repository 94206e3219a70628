"""Every model family through the whole stack — HTTP, NATS, tokenizer, worker, as processes — against
sentence-transformers' ``encode`` on the same folder (tiny random-weight checkpoints, built here):
one gateway in front of a tokenizer and a worker per family, each model on its own subjects."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support import nomic_moe
from tests.support.corpus import mixed_texts
from tests.support.procs import running_fleet
from tests.support.tiny_llm_rerankers import build_llm_reranker
from tests.support.tiny_models import build, st_reference

pytestmark = pytest.mark.integration

PREFIX = "families"
# (folder, family, bidirectional, the prompt a query request selects)
MODELS = [
    ("mpnet", "mpnet", False, None),
    ("modernbert", "modernbert", False, None),
    ("qwen3", "qwen3", False, "query"),
    ("qwen3-bidir", "qwen3", True, "query"),
    ("qwen2", "qwen2", False, "query"),
    ("mistral", "mistral", False, "query"),
    ("llama", "llama", False, None),
    ("gemma3", "gemma3", False, "query"),
    ("gte", "gte", False, "query"),
    ("nomic_bert", "nomic_bert", False, "query"),
    ("gemma2", "gemma2", False, "query"),
]
# nomic-embed-text-v2-moe (no transformers class: its reference is the published forward, written in
# tests/support/nomic_moe.py)
MOE = "nomic-moe"
# EmbeddingGemma's stack with include_prompt=false in its Pooling (INSTRUCTOR-style): the prompt's
# tokens are skipped by pooling
INSTRUCTOR = ("gemma3-instructor", "gemma3", False, "query")
CLASSIFIERS = ["modernbert", "qwen3"]  # rerankers (one logit), served by a scorer each as "<family>-cls"
# an LLM reranker (Qwen3ForCausalLM + LogitScore, its chat template, a default prompt), with its scorer
LLM_RERANKER = "qwen3-llm"
LLM_PROMPT = "Given a question about Python, retrieve the passages that answer it"


@pytest.fixture(scope="module")
def fleet(nats_url: str, tmp_path_factory) -> Iterator[tuple[str, dict]]:
    root = tmp_path_factory.mktemp("families")
    folders = {name: build(family, root, bidirectional=bidir) for name, family, bidir, _ in MODELS}
    folders[INSTRUCTOR[0]] = _skipping_prompts(folders["gemma3"], root / INSTRUCTOR[0])
    folders[MOE] = nomic_moe.make_folder(root / "moe-build", nomic_moe.CONFIG).rename(root / MOE)  # served by its name
    for family in CLASSIFIERS:
        folders[f"{family}-cls"] = build(family, root, classifier=True, num_labels=1)
    folders[LLM_RERANKER] = build_llm_reranker(root, "qwen3", name=LLM_RERANKER, prompt=LLM_PROMPT)
    scored = [name for name in folders if name.endswith("-cls") or name == LLM_RERANKER]
    with running_fleet(nats_url, PREFIX, folders, tmp_path_factory.mktemp("family-logs"), scored=scored) as (url, _):
        yield url, folders


def _skipping_prompts(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to)
    pooling = json.loads((to / "1_Pooling" / "config.json").read_text())
    (to / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "include_prompt": False}))
    return to


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return mixed_texts(24)  # 1 to 300+ tokens: past every sliding window, some cut at the 256-token limit


def _vectors(base_url: str, model: str, texts: list[str], input_type: str | None = None) -> np.ndarray:
    """The vectors /v1/embeddings answers for ``texts`` (with the prompt ``input_type`` selects)."""
    body = {"model": model, "input": texts, **({"input_type": input_type} if input_type else {})}
    r = httpx.post(f"{base_url}/v1/embeddings", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], np.float32)


@pytest.mark.parametrize("name, family, bidirectional, prompt", [*MODELS, INSTRUCTOR])
def test_vectors_equal_sentence_transformers(fleet, texts, name, family, bidirectional, prompt):
    base_url, folders = fleet
    for input_type in dict.fromkeys([None, prompt]):
        got = _vectors(base_url, name, texts, input_type)
        want = st_reference(folders[name], texts, prompt_name=input_type)
        assert got.shape == want.shape
        c = cosines(got, want)
        assert c.min() >= COSINE_TOLERANCE, (
            f"{name} ({input_type or 'no prompt'}): worst cosine {c.min():.6f} at {c.argmin()}"
        )


def test_mixture_of_experts_vectors_equal_the_published_forward(fleet, texts):
    """nomic-embed-text-v2-moe's folder through the stack, its query prompt too, against a padded forward
    of the published definition in which every expert of every mixture layer has tokens."""
    base_url, folders = fleet
    for input_type, prefix in ((None, ""), ("query", "search_query: ")):
        got = _vectors(base_url, MOE, texts, input_type)
        want = nomic_moe.reference_vectors(folders[MOE], [prefix + t for t in texts])
        c = cosines(got, want)
        assert c.min() >= COSINE_TOLERANCE, f"{input_type or 'no prompt'}: worst cosine {c.min():.6f} at {c.argmin()}"


def test_prompts_change_the_vectors_and_models_differ(fleet, texts):
    base_url, _ = fleet
    first = texts[:4]
    assert cosines(_vectors(base_url, "qwen3", first), _vectors(base_url, "qwen3", first, "query")).max() < 0.9999
    assert (
        cosines(_vectors(base_url, "qwen3", first), _vectors(base_url, "qwen3-bidir", first)).max() < 0.9999
    )  # the attention flag is honoured


def test_unknown_model_lists_the_served_ones(fleet):
    base_url, _ = fleet
    r = httpx.post(f"{base_url}/v1/embeddings", json={"model": "nomic-bert", "input": "x"}, timeout=30)
    assert r.status_code == 404, r.text
    assert all(name in r.text for name, *_ in MODELS)


@pytest.mark.parametrize("family", CLASSIFIERS)
def test_reranker_scores_equal_transformers(fleet, family):
    """Sequence-classification rerankers of the families, through the scorer: each candidate's score is
    the sigmoid of transformers' logit for the (query, document) pair."""
    from tests.support.corpus import medium_texts
    from tests.support.tiny_models import hf_reference_logits

    base_url, folders = fleet
    query, docs = "how do I read a file line by line", medium_texts(20)
    logits = hf_reference_logits(folders[f"{family}-cls"], [(query, d) for d in docs])[:, 0]
    assert np.ptp(logits) > 0.1
    r = httpx.post(
        f"{base_url}/v1/rerank",
        json={"model": f"{family}-cls", "query": query, "documents": docs, "top_n": len(docs)},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    got = np.array([x["relevance_score"] for x in results])
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-logits[[x["index"] for x in results]])), atol=1e-4)
    assert list(got) == sorted(got, reverse=True)


def test_llm_reranker_scores_equal_cross_encoder(fleet, nats_url):
    """The LLM reranker through gateway, scorer, tokenizer and worker processes: /v1/rerank's scores are
    ``CrossEncoder.predict``'s (sigmoid of logit["yes"] - logit["no"], the folder's prompt, long pairs cut
    as it cuts them); the scorer's raw scores are its logits."""
    import asyncio

    import nats
    import torch

    from embedfleet.shared.nats.subjects import Subjects
    from embedfleet.shared.protocol import RerankRequest, RerankResult, decode, encode
    from tests.support.corpus import medium_texts
    from tests.support.tiny_llm_rerankers import reference

    base_url, folders = fleet
    model = reference(folders[LLM_RERANKER])
    query = "how do I read a file line by line"
    docs = medium_texts(14) + [t for t in mixed_texts(24) if len(t) > 3000][:2]  # two cut at the limit
    pairs = [(query, d) for d in docs]
    want = model.predict(pairs, batch_size=8)
    logits = model.predict(pairs, activation_fn=torch.nn.Identity(), batch_size=8)
    assert np.ptp(logits) > 0.1
    r = httpx.post(
        f"{base_url}/v1/rerank",
        json={"model": LLM_RERANKER, "query": query, "documents": docs, "top_n": len(docs)},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    got = np.array([x["relevance_score"] for x in results])
    np.testing.assert_allclose(got, want[[x["index"] for x in results]], atol=1e-4)
    assert list(got) == sorted(got, reverse=True)

    async def raw() -> RerankResult:
        nc = await nats.connect(nats_url)
        try:
            request = RerankRequest("llm-raw", LLM_RERANKER, query, docs, time.time() + 60, raw_scores=True)
            return decode((await nc.request(Subjects(PREFIX).rerank(LLM_RERANKER), encode(request), timeout=60)).data)
        finally:
            await nc.close()

    ranked = asyncio.run(raw())
    assert isinstance(ranked, RerankResult), ranked
    np.testing.assert_allclose(ranked.scores, logits[ranked.indices], atol=1e-4)
