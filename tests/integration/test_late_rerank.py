"""Reranking with multi-vector models, which have no scorer, through the whole stack (HTTP, NATS, tokenizer,
worker as processes): the gateway ranks by MaxSim over the model's token vectors (services/gateway/rerank/late.py).

A ColBERT-style text model (a sentence-transformers MultiVectorEncoder folder) on TEI's /rerank, Cohere's and
Jina's /v1/rerank and Cohere's /v2/rerank scores as MaxSim over the vectors /embed_all answers for the same
inputs (the query as a query, the documents as documents), and charges the tokens those embeddings count; a
page model (ColQwen2) ranks Jina's image documents, beside a text one, as ColQwen2Processor.score_retrieval
ranks transformers' vectors. Image documents for a text model, and over-long inputs, are refused in each
route's error shape."""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from embedfleet.services.gateway.cohere.answers import RerankV1Answer
from tests.support.image_files import data_uri, encoded, noise
from tests.support.output_models import build_colbert
from tests.support.page_models import build_colqwen2, reference
from tests.support.procs import post, running_fleet
from tests.support.prometheus_text import value

pytestmark = pytest.mark.integration

PREFIX = "late-rerank"
COLBERT = "colbert"
PAGES = "colqwen2"
QUERY = "how do foxes find their food in winter?"
DOCUMENTS = [
    "Foxes hunt small rodents under the snow, listening for them before they pounce.",
    "The stock market closed higher on Tuesday.",
    "x",
    "In winter a red fox eats mice, voles, berries and whatever food it can find.",
    "Foxes, foxes, foxes!",
    "A recipe for bread: flour, water, salt and yeast.",
]
RTOL = 1e-4  # our MaxSim against MaxSim over /embed_all's answer: the same vectors, summed in another order


@pytest.fixture(scope="module")
def fleet(nats_url: str, tmp_path_factory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("late-rerank-models")
    models = {COLBERT: build_colbert(root), PAGES: build_colqwen2(root)}
    with running_fleet(nats_url, PREFIX, models, tmp_path_factory.mktemp("late-rerank-logs"), named=True) as (url, _):
        yield url, models[PAGES]


def _maxsim(query: np.ndarray, documents: list[np.ndarray]) -> np.ndarray:
    return np.array([(query @ d.T).max(axis=1).sum() for d in documents], dtype=np.float64)


def _token_vectors(url: str, model: str, inputs: list, input_type: str | None = None) -> list[np.ndarray]:
    body = {"model": model, "inputs": inputs, **({"input_type": input_type} if input_type else {})}
    r = post(url, "/embed_all", body)
    assert r.status_code == 200, r.text
    return [np.asarray(rows, dtype=np.float64) for rows in r.json()]


def _expected(url: str, documents: list[str]) -> np.ndarray:
    """MaxSim over /embed_all's vectors: the query embedded as a query, the documents as documents."""
    query = _token_vectors(url, COLBERT, [QUERY], "query")[0]
    return _maxsim(query, _token_vectors(url, COLBERT, documents, "document"))


def _check_ranking(indices: list[int], scores: list[float], want: np.ndarray, count: int, rtol: float) -> None:
    """Every document once (or the best ``count``), best first, each with the reference's score (order is
    checked through the scores: near-equal documents may swap within the tolerance)."""
    assert len(indices) == count and len(set(indices)) == count
    assert all(a >= b for a, b in itertools.pairwise(scores))
    np.testing.assert_allclose(scores, want[indices], rtol=rtol, atol=rtol)
    np.testing.assert_allclose(scores, np.sort(want)[::-1][:count], rtol=rtol, atol=rtol)


def test_tei_rerank_scores_maxsim_over_embed_all(fleet):
    url = fleet[0]
    want = _expected(url, DOCUMENTS)
    assert len(set(np.round(want, 3))) == len(DOCUMENTS)  # distinct scores: the order means something
    r = post(url, "/rerank", {"model": COLBERT, "query": QUERY, "texts": DOCUMENTS, "return_text": True})
    assert r.status_code == 200, r.text
    rows = r.json()
    _check_ranking([row["index"] for row in rows], [row["score"] for row in rows], want, len(DOCUMENTS), RTOL)
    assert all(row["text"] == DOCUMENTS[row["index"]] for row in rows)
    # raw_scores asks a cross-encoder for logits: MaxSim sums are what they are
    raw = post(url, "/rerank", {"model": COLBERT, "query": QUERY, "texts": DOCUMENTS, "raw_scores": True})
    assert [row["score"] for row in raw.json()] == [row["score"] for row in rows]


def test_cohere_and_jina_rerank_top_n_and_documents(fleet):
    url = fleet[0]
    want = _expected(url, DOCUMENTS)
    body = {
        "model": COLBERT,
        "query": QUERY,
        "documents": [DOCUMENTS[0], *({"text": d} for d in DOCUMENTS[1:])],
        "top_n": 3,
        "return_documents": True,
    }
    r = post(url, "/v1/rerank", body)
    assert r.status_code == 200, r.text
    RerankV1Answer.model_validate_json(r.content)  # the answer /openapi.json describes, strictly
    assert r.json()["model"] == COLBERT
    results = r.json()["results"]
    _check_ranking([x["index"] for x in results], [x["relevance_score"] for x in results], want, 3, RTOL)
    assert all(x["document"] == {"text": DOCUMENTS[x["index"]]} for x in results)

    v2 = post(url, "/v2/rerank", {"model": COLBERT, "query": QUERY, "documents": DOCUMENTS})
    assert v2.status_code == 200, v2.text
    ranked = v2.json()["results"]
    _check_ranking([x["index"] for x in ranked], [x["relevance_score"] for x in ranked], want, len(DOCUMENTS), RTOL)

    empty = post(url, "/v1/rerank", {"model": COLBERT, "query": QUERY, "documents": []})
    assert empty.status_code == 200 and empty.json()["results"] == [], empty.text


def test_the_tokens_charged_are_those_the_embeddings_count(fleet):
    url = fleet[0]

    def counted() -> float:
        return value(httpx.get(f"{url}/metrics", timeout=30).text, "embedfleet_tokens_total", model=COLBERT)

    before = counted()
    _expected(url, DOCUMENTS)
    embedded = counted() - before
    assert embedded > 0
    r = post(url, "/v1/rerank", {"model": COLBERT, "query": QUERY, "documents": DOCUMENTS})
    assert r.status_code == 200, r.text
    assert counted() - before == 2 * embedded


def test_page_model_ranks_image_documents_as_score_retrieval(fleet):
    url, folder = fleet
    rng = np.random.default_rng(11)
    pages = [encoded(noise(w, h, rng)) for w, h in [(120, 160), (300, 90), (40, 40), (64, 200)]]
    text = "a table of the revenue by quarter"
    documents: list = [{"image": data_uri(pages[0])}, text, *({"image": data_uri(p)} for p in pages[1:])]
    r = post(url, "/v1/rerank", {"model": PAGES, "query": QUERY, "documents": documents, "return_documents": True})
    assert r.status_code == 200, r.text
    RerankV1Answer.model_validate_json(r.content)
    results = r.json()["results"]
    # only the text document is sent back: an image document is the client's own
    assert [x["document"] for x in results if "document" in x] == [{"text": text}]
    assert {x["index"] for x in results if "document" in x} == {1}

    model, processor = reference(folder)
    with torch.no_grad():  # one at a time: no padding, positions from 0 as the engine runs each row
        query = model(**processor.process_queries([QUERY])).embeddings[0]
        shown = [model(**processor.process_images([Image.open(io.BytesIO(p))])).embeddings[0] for p in pages]
        said = model(**processor.process_queries([text])).embeddings[0]  # a page model's texts are queries
    theirs = processor.score_retrieval([query], [shown[0], said, *shown[1:]])[0].numpy().astype(np.float64)
    assert len(set(np.round(theirs, 2))) == len(documents)  # distinct scores: the order means something
    order = [x["index"] for x in results]
    assert order == np.argsort(-theirs, kind="stable").tolist()
    _check_ranking(order, [x["relevance_score"] for x in results], theirs, len(documents), 1e-3)


def test_image_documents_for_a_text_model_get_a_clear_400(fleet):
    url = fleet[0]
    page = data_uri(encoded(Image.new("RGB", (40, 40))))
    r = post(url, "/v1/rerank", {"model": COLBERT, "query": QUERY, "documents": ["a text", {"image": page}]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]  # OpenAI's shape, as /v1/rerank answers every error
    assert error["param"] == "documents" and error["type"] == "invalid_request_error"
    assert error["message"].startswith("'documents[1]' is an image, and colbert ranks texts only"), error
    bad = post(url, "/v1/rerank", {"model": PAGES, "query": QUERY, "documents": [{"image": "data:image/png;base64,"}]})
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("'documents[0]': "), bad.text
    again = post(url, "/v1/rerank", {"model": COLBERT, "query": QUERY, "documents": ["still serving"]})
    assert again.status_code == 200, again.text


def test_over_long_inputs_are_named_in_tei_s_shape(fleet):
    """TEI's /rerank refuses over-long inputs unless truncate: a document named as the scorer names a
    candidate, the query as the query."""
    url = fleet[0]
    limit = next(m for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"] if m["id"] == COLBERT)
    long = "fox " * (limit["max_tokens"] + 8)
    r = post(url, "/rerank", {"model": COLBERT, "query": QUERY, "texts": ["short", long]})
    assert r.status_code == 413 and r.json()["error"].startswith("candidate 1 has "), r.text
    r = post(url, "/rerank", {"model": COLBERT, "query": long, "texts": ["short"]})
    assert r.status_code == 413 and r.json()["error"].startswith("the query has "), r.text
    cut = post(url, "/rerank", {"model": COLBERT, "query": long, "texts": ["short", long], "truncate": True})
    assert cut.status_code == 200 and len(cut.json()) == 2, cut.text
