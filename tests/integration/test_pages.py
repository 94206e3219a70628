"""A page model (ColQwen2) through the whole stack — HTTP, NATS, tokenizer (decoding and resizing pages,
expanding the page prompt's image token), worker (the vision tower, then the language model) as processes —
against transformers' ColQwen2ForRetrieval and ColQwen2Processor on the same files: TEI's /embed_all with
{'image': data URI} and {'text': ...} items answers a vector per token of each page and each query; MaxSim
over them ranks as the processor's score_retrieval does; a page the processor refuses, or an image for a
text model, gets a clear 400 and the stack serves on."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from embedfleet.shared.model_dir.folder import default_model_path
from tests.conftest import COSINE_TOLERANCE
from tests.support.image_files import data_uri, encoded, noise
from tests.support.page_models import build_colqwen2, reference
from tests.support.procs import running_fleet

pytestmark = pytest.mark.integration

PREFIX = "pages"
MODEL = "colqwen2"
TEXT_MODEL = "mini"
QUERIES = ["what was the revenue in 2023?", "a chart of rainfall by month", "x"]


@pytest.fixture(scope="module")
def fleet(nats_url: str, tmp_path_factory) -> Iterator[tuple[str, Path]]:
    folder = build_colqwen2(tmp_path_factory.mktemp("colqwen2-build"))
    models = {MODEL: folder, TEXT_MODEL: default_model_path()}
    with running_fleet(nats_url, PREFIX, models, tmp_path_factory.mktemp("page-logs"), named=True) as (url, _):
        yield url, folder


@pytest.fixture(scope="module")
def theirs(fleet):
    return reference(fleet[1])


def _pages() -> list[Image.Image]:
    rng = np.random.default_rng(7)
    return [noise(w, h, rng) for w, h in [(120, 160), (300, 90), (40, 40)]]


def _embed_all(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/embed_all", json=body, timeout=120)


def _reference_pages(theirs, pages: list[Image.Image]) -> list[np.ndarray]:
    model, processor = theirs
    with torch.no_grad():  # one at a time: no padding, positions from 0 as the engine runs each row
        return [model(**processor.process_images([page])).embeddings[0].numpy() for page in pages]


def _reference_queries(theirs, queries: list[str]) -> list[np.ndarray]:
    model, processor = theirs
    with torch.no_grad():
        return [model(**processor.process_queries([q])).embeddings[0].numpy() for q in queries]


def _check_tokens(ours: list, expected: list[np.ndarray]) -> None:
    assert len(ours) == len(expected)
    for mine, them in zip(ours, expected):
        mine = np.asarray(mine, dtype=np.float32)
        assert mine.shape == them.shape, (mine.shape, them.shape)
        cos = (mine * them).sum(1) / (np.linalg.norm(mine, axis=1) * np.linalg.norm(them, axis=1))
        assert cos.min() >= COSINE_TOLERANCE, cos.min()


def test_pages_embed_a_vector_per_token_as_transformers_does(fleet, theirs):
    url = fleet[0]
    pages = _pages()
    reply = _embed_all(url, {"model": MODEL, "inputs": [{"image": data_uri(encoded(p))} for p in pages]})
    assert reply.status_code == 200, reply.text
    _check_tokens(reply.json(), _reference_pages(theirs, [Image.open(io.BytesIO(encoded(p))) for p in pages]))


def test_queries_embed_as_the_processor_wraps_them(fleet, theirs):
    reply = _embed_all(fleet[0], {"model": MODEL, "inputs": QUERIES})
    assert reply.status_code == 200, reply.text
    _check_tokens(reply.json(), _reference_queries(theirs, QUERIES))


def test_queries_and_pages_mixed_answer_in_order_and_rank_as_score_retrieval(fleet, theirs):
    """Jina's items, texts and pages in one request, answered in the order given; MaxSim over the answer
    ranks the pages for each query as the processor's score_retrieval ranks transformers' vectors."""
    url = fleet[0]
    pages = _pages()
    items = [{"text": QUERIES[0]}, {"image": data_uri(encoded(pages[0]))}, {"text": QUERIES[1]}]
    items += [{"image": data_uri(encoded(p))} for p in pages[1:]]
    reply = _embed_all(url, {"model": MODEL, "inputs": items})
    assert reply.status_code == 200, reply.text
    rows = [np.asarray(r, dtype=np.float32) for r in reply.json()]
    queries, docs = [rows[0], rows[2]], [rows[1], rows[3], rows[4]]
    _check_tokens(queries, _reference_queries(theirs, QUERIES[:2]))
    _check_tokens(docs, _reference_pages(theirs, pages))
    ours = np.array([[(q @ d.T).max(1).sum() for d in docs] for q in queries])
    processor = theirs[1]
    expected = processor.score_retrieval(
        [torch.from_numpy(q) for q in _reference_queries(theirs, QUERIES[:2])],
        [torch.from_numpy(d) for d in _reference_pages(theirs, pages)],
    ).numpy()
    np.testing.assert_allclose(ours, expected, rtol=1e-3, atol=1e-3)


def test_models_lists_a_page_model_with_its_inputs(fleet):
    models = {m["id"]: m for m in httpx.get(f"{fleet[0]}/v1/models", timeout=30).json()["data"]}
    assert models[MODEL]["inputs"] == ["text", "image"]
    assert models[MODEL]["kind"] == "multivector" and models[MODEL]["outputs"] == ["multivector"]


@pytest.mark.parametrize(
    ("model", "image", "says"),
    [
        (MODEL, Image.new("RGB", (2010, 10)), "aspect ratio"),
        (TEXT_MODEL, Image.new("RGB", (40, 40)), "texts only"),
    ],
    ids=["too-elongated", "text-model"],
)
def test_a_page_refused_gets_a_clear_400_and_the_stack_serves_on(fleet, model, image, says):
    url = fleet[0]
    reply = _embed_all(url, {"model": model, "inputs": [{"text": "fine"}, {"image": data_uri(encoded(image))}]})
    assert reply.status_code == 400, reply.text
    assert says in reply.json()["error"], reply.text
    again = _embed_all(url, {"model": MODEL, "inputs": ["still serving"]})
    assert again.status_code == 200, again.text


def test_a_dense_route_refuses_a_page_model_naming_what_it_makes(fleet):
    reply = httpx.post(f"{fleet[0]}/v1/embeddings", json={"model": MODEL, "input": "a query"}, timeout=30)
    assert reply.status_code == 400, reply.text
    assert "does not make dense vectors (it makes: multivector" in reply.json()["error"]["message"]


def test_token_ids_or_texts_that_hold_the_image_token_are_refused(fleet):
    """Image tokens stand for a page's image: token IDs that hold one get a 422, a query's text that names the
    token a 400, each naming the input and the token, and the stack serves on."""
    from bench.page_models import IMAGE_PAD
    from embedfleet.shared.model_dir.load import IMAGE_TOKEN

    url = fleet[0]
    reply = _embed_all(url, {"model": MODEL, "inputs": [[5, 6, 7], [5, IMAGE_PAD, 7]]})
    assert reply.status_code == 422, reply.text
    assert f"holds the image token (id {IMAGE_PAD})" in reply.json()["error"], reply.text
    text = _embed_all(url, {"model": MODEL, "inputs": ["a query", f"find {IMAGE_TOKEN} here"]})
    assert text.status_code == 400, text.text
    assert f"holds the image token (id {IMAGE_PAD})" in text.json()["error"], text.text
    again = _embed_all(url, {"model": MODEL, "inputs": ["still serving"]})
    assert again.status_code == 200, again.text


def test_the_docs_page_example_runs_as_typed(fleet, theirs, tmp_path):
    """docs/http-api.md's "Pages (ColQwen2)" snippet, run as a newcomer would (its page.png beside it, the
    gateway's address where the page has localhost:8080): a query's and a page's token counts and their MaxSim
    as transformers' vectors give them."""
    import re
    import subprocess
    import sys

    page = (Path(__file__).resolve().parents[2] / "docs" / "http-api.md").read_text()
    section = page.split("### Pages (ColQwen2)", 1)[1].split("\n### ", 1)[0]
    (snippet,) = re.findall(r"```python\n(.*?)```", section, re.S)
    picture = _pages()[0]
    picture.save(tmp_path / "page.png")
    run = subprocess.run(
        [sys.executable, "-c", snippet.replace("http://localhost:8080", fleet[0])],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    query = _reference_queries(theirs, ["revenue in 2023"])[0]
    (doc,) = _reference_pages(theirs, [Image.open(tmp_path / "page.png")])
    score = float((query @ doc.T).max(1).sum())
    tokens, patches, printed = run.stdout.split()
    assert (int(tokens), int(patches)) == (len(query), len(doc)), run.stdout
    assert abs(float(printed) - score) <= 2e-3, (run.stdout, score)  # rounded to 3 places, float noise beside
