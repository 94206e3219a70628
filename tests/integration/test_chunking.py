"""Long texts cut into chunks through the processes: POST /v1/embeddings with `chunking`, each chunk's
vector against sentence-transformers' encode of the chunk's text (cosine >= COSINE_TOLERANCE)."""

from __future__ import annotations

import base64
import itertools

import httpx
import numpy as np
import pytest

from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import long_texts
from tests.support.procs import post

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def texts() -> list[str]:
    document = " ".join(long_texts(3))  # several hundred tokens: many windows
    return [document, "A short query that fits one window."]


def _embed(stack, texts, chunking, **extra) -> httpx.Response:
    return post(stack.base_url, "/v1/embeddings", {"model": MODEL, "input": texts, "chunking": chunking, **extra})


def _content_tokens(reference, text: str) -> int:
    return len(reference.tokenizer(text, add_special_tokens=False)["input_ids"])


def test_each_chunk_is_the_vector_of_its_text_and_the_chunks_cover_the_input(stack, reference, texts):
    r = _embed(stack, texts, {"size": 64, "overlap": 16})
    assert r.status_code == 200, r.text
    body = r.json()
    items = body["data"]
    assert [d["index"] for d in items] == sorted(d["index"] for d in items) and {d["index"] for d in items} == {0, 1}
    first, second = ([d for d in items if d["index"] == i] for i in (0, 1))
    assert [d["chunk"] for d in first] == list(range(len(first))) and len(first) > 5
    assert [(d["chunk"], d["start"], d["end"]) for d in second] == [(0, 0, len(texts[1]))]  # it fits one window
    pieces = [texts[d["index"]][d["start"] : d["end"]] for d in items]
    assert all(_content_tokens(reference, p) <= 64 for p in pieces)
    starts, ends = [d["start"] for d in first], [d["end"] for d in first]
    assert starts[0] == 0 and ends[-1] == len(texts[0].rstrip()) and all(a < b for a, b in itertools.pairwise(starts))
    assert all(s <= e_prev for s, e_prev in zip(starts[1:], ends)), "consecutive chunks overlap or touch"
    got = np.array([d["embedding"] for d in items], np.float32)
    want = reference.encode(pieces, convert_to_numpy=True)
    assert cosines(got, want).min() >= COSINE_TOLERANCE
    tokens = sum(_content_tokens(reference, p) + 2 for p in pieces)  # [CLS] and [SEP] of each chunk
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    b64 = _embed(stack, texts, {"size": 64, "overlap": 16}, encoding_format="base64").json()["data"]
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in b64])
    np.testing.assert_allclose(decoded, got, rtol=0, atol=1e-6)


def test_sentence_boundaries_cut_after_a_sentence_end(stack, texts):
    r = _embed(stack, texts[:1], {"size": 64, "boundary": "sentence"})
    assert r.status_code == 200, r.text
    text = texts[0]
    inner = list(r.json()["data"])[:-1]  # every chunk but the last ends where the text goes on
    assert inner and sum(text[d["end"] - 1] in ".!?" for d in inner) >= len(inner) // 2


def test_the_mean_is_the_token_weighted_mean_of_the_chunks_normalised(stack, reference, texts):
    chunked = _embed(stack, texts, {"size": 64, "overlap": 16}).json()["data"]
    r = _embed(stack, texts, {"size": 64, "overlap": 16, "return": "mean"})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [(d["index"], "chunk" in d) for d in data] == [(0, False), (1, False)]
    for i, text in enumerate(texts):
        mine = [d for d in chunked if d["index"] == i]
        weights = np.array([_content_tokens(reference, text[d["start"] : d["end"]]) for d in mine], np.float64)
        vectors = reference.encode([text[d["start"] : d["end"]] for d in mine], convert_to_numpy=True)
        mean = weights @ vectors / weights.sum()
        mean /= np.linalg.norm(mean)
        assert cosines(np.array([data[i]["embedding"]]), mean[None]).min() >= COSINE_TOLERANCE
    int8 = _embed(stack, texts, {"size": 64, "overlap": 16, "return": "mean"}, embedding_type="int8")
    assert int8.status_code == 200, int8.text
    assert all(isinstance(x, int) and -128 <= x <= 127 for d in int8.json()["data"] for x in d["embedding"])


@pytest.mark.parametrize(
    "chunking, extra, status, message",
    [
        ({"size": 300}, {}, 400, "chunking.size is 300; this model holds at most 254 tokens of text a chunk"),
        ({"size": 64, "late": 1}, {}, 400, "'chunking.late' must be true or false"),
        ({"size": 64, "stride": 3}, {}, 400, "'chunking' has unknown keys 'stride'"),
        ({"size": 1}, {}, 413, "input 0 takes the request past 1024 chunks"),
    ],
    ids=["over-room", "late", "unknown-key", "too-many-chunks"],
)
def test_wrong_chunking_is_refused_in_the_openai_shape(stack, texts, chunking, extra, status, message):
    r = _embed(stack, texts, chunking, **extra)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"].startswith(message), error


def test_token_inputs_cannot_be_chunked(stack):
    r = _embed(stack, [[101, 2000, 102]], {"size": 64})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chunking", r.text


def test_the_readme_example_is_answered_as_it_says(stack):
    """The chunking curl of the README and of docs/http-api.md, its body sent as written: an item per chunk,
    with its offsets."""
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for page in ("README.md", "docs/http-api.md"):
        text = (root / page).read_text()
        bodies = re.findall(r"curl -s localhost:8080/v1/embeddings [^\n]*-d '(\{[^']*\"chunking\"[^']*)'", text)
        (body,) = [b for b in bodies if '"late": true' not in b]  # the late example: test_late_chunking.py
        sent = json.loads(body)
        r = httpx.post(f"{stack.base_url}/v1/embeddings", json=sent, timeout=120)
        assert r.status_code == 200, (page, r.text)
        (item,) = r.json()["data"]  # "a long document ..." fits one window
        assert (item["index"], item["chunk"], item["start"], item["end"]) == (0, 0, 0, len(sent["input"][0])), page
        assert len(item["embedding"]) == 384, page


def test_a_binary_answer_takes_the_mean_and_refuses_chunk_offsets(stack, texts):
    url, body = f"{stack.base_url}/v1/embeddings", {"model": MODEL, "input": texts}
    mean = httpx.post(
        url,
        json={**body, "chunking": {"size": 64, "return": "mean"}},
        headers={"accept": "application/octet-stream"},
        timeout=120,
    )
    assert mean.status_code == 200 and len(mean.content) == 2 * 384 * 4, mean.text[:300]
    chunks = httpx.post(
        url, json={**body, "chunking": {"size": 64}}, headers={"accept": "application/octet-stream"}, timeout=120
    )
    assert chunks.status_code == 400 and chunks.json()["error"]["param"] == "chunking", chunks.text
