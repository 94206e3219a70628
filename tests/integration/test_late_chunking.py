"""Late chunking through the processes: POST /v1/embeddings with `"chunking": {"late": true}`.

Each chunk's vector against transformers' AutoModel on the same folder: the last hidden states of the
input ([CLS] text [SEP]), or, for an input over the model's limit, of the window the chunk is pooled
in, averaged over the positions of the chunk's tokens, L2-normalised; equal when the cosine is at
least COSINE_TOLERANCE (float32 on CPU). The chunks' offsets are plain chunking's.
"""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from embedfleet.shared.chunk_windows import late_windows
from embedfleet.shared.text_chunks import TextChunk
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import long_texts
from tests.support.late_reference import Reference
from tests.support.procs import post

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"
ROOM = 254  # MiniLM's 256 tokens less [CLS] and [SEP]


@pytest.fixture(scope="module")
def ref(model_info) -> Reference:
    assert model_info.max_seq_length == 256  # sentence_bert_config.json's: the limit ROOM is made from
    return Reference(model_info.path)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    document = " ".join(long_texts(1)[0].split()[:100])  # within the model's limit: one window
    return [document, "A short query that fits one chunk."]


def _embed(stack, texts, chunking, **extra) -> httpx.Response:
    return post(stack.base_url, "/v1/embeddings", {"model": MODEL, "input": texts, "chunking": chunking, **extra})


def _by_input(items: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for d in items:
        out.setdefault(d["index"], []).append(d)
    return out


def test_each_late_chunk_is_its_tokens_mean_in_the_whole_input(stack, ref, texts):
    chunking = {"size": 32, "overlap": 8, "late": True}
    r = _embed(stack, texts, chunking)
    assert r.status_code == 200, r.text
    body = r.json()
    plain = _embed(stack, texts, {**chunking, "late": False}).json()["data"]
    assert [(d["index"], d["chunk"], d["start"], d["end"]) for d in body["data"]] == [
        (d["index"], d["chunk"], d["start"], d["end"]) for d in plain
    ], "late chunks are plain chunking's"
    per_input = _by_input(body["data"])
    assert sorted(per_input) == [0, 1] and len(per_input[0]) > 4 and len(per_input[1]) == 1
    for i, text in enumerate(texts):
        items = per_input[i]
        assert [d["chunk"] for d in items] == list(range(len(items)))
        spans = [ref.tokens(text, d["start"], d["end"]) for d in items]
        for d, (a, b) in zip(items, spans):  # input[start:end] is the chunk's text: its tokens, whole words
            assert text[d["start"] : d["end"]].strip() == text[d["start"] : d["end"]] != ""
            assert b - a <= 32
        covered = set().union(*(range(a, b) for a, b in spans))
        assert covered == set(range(len(ref.offsets(text)))), "the chunks cover the input's tokens"
        got = np.array([d["embedding"] for d in items], np.float32)
        assert cosines(got, ref.chunk_vectors(text, spans)).min() >= COSINE_TOLERANCE
    # pooled in context, not from the chunk's text alone: plain chunking's vectors differ
    late0 = np.array([d["embedding"] for d in per_input[0]])
    plain0 = np.array([d["embedding"] for d in plain if d["index"] == 0])
    assert cosines(late0, plain0).min() < 0.98
    tokens = sum(len(ref.offsets(t)) + 2 for t in texts)  # one window each: the whole input, [CLS] and [SEP]
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_the_late_mean_is_the_token_weighted_mean_of_the_chunks_normalised(stack, ref, texts):
    chunking = {"size": 32, "overlap": 8, "late": True}
    chunks = _by_input(_embed(stack, texts, chunking).json()["data"])
    r = _embed(stack, texts, {**chunking, "return": "mean"})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [(d["index"], "chunk" in d) for d in data] == [(0, False), (1, False)]
    for i, text in enumerate(texts):
        spans = [ref.tokens(text, d["start"], d["end"]) for d in chunks[i]]
        weights = np.array([b - a for a, b in spans], np.float64)
        mean = weights @ ref.chunk_vectors(text, spans) / weights.sum()
        assert cosines(np.array([data[i]["embedding"]]), (mean / np.linalg.norm(mean))[None]).min() >= COSINE_TOLERANCE


def test_forms_and_dimensions_apply_to_late_chunks(stack, ref, texts):
    chunking = {"size": 48, "late": True}
    floats = _embed(stack, texts, chunking).json()["data"]
    b64 = _embed(stack, texts, chunking, encoding_format="base64").json()["data"]
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in b64])
    np.testing.assert_allclose(decoded, np.array([d["embedding"] for d in floats], np.float32), rtol=0, atol=1e-6)
    short = _embed(stack, texts, chunking, dimensions=128).json()["data"]
    full = np.array([d["embedding"] for d in floats])[:, :128]
    assert cosines(np.array([d["embedding"] for d in short]), full).min() >= COSINE_TOLERANCE
    assert all(abs(np.linalg.norm(d["embedding"]) - 1) < 1e-3 for d in short)  # renormalised
    int8 = _embed(stack, texts, chunking, embedding_type="int8")
    assert int8.status_code == 200, int8.text
    assert all(isinstance(x, int) and -128 <= x <= 127 for d in int8.json()["data"] for x in d["embedding"])


def test_an_input_over_the_limit_is_read_in_windows_each_chunk_pooled_in_its_own(stack, ref):
    text = " ".join(" ".join(long_texts(2)).split()[:700])  # several hundred tokens past the model's limit
    total = len(ref.offsets(text))
    assert total > 2 * ROOM
    r = _embed(stack, [text], {"size": 64, "overlap": 16, "late": True})
    assert r.status_code == 200, r.text
    items = r.json()["data"]
    chunks = [TextChunk(d["start"], d["end"], *ref.tokens(text, d["start"], d["end"])) for d in items]
    assert chunks[0].first == 0 and chunks[-1].last == total and all(c.tokens <= 64 for c in chunks)
    windows = late_windows(chunks, ROOM)
    assert len(windows) >= 3 and any(w.first < w.own for w in windows)  # windows with context before their chunks
    got = np.array([d["embedding"] for d in items], np.float32)
    usage = 0
    for w in windows:
        start, end = chunks[w.first].start, chunks[w.end - 1].end
        window = text[start:end]
        spans = [ref.tokens(window, c.start - start, c.end - start) for c in chunks[w.own : w.end]]
        want = ref.chunk_vectors(window, spans)
        assert cosines(got[w.own : w.end], want).min() >= COSINE_TOLERANCE, w
        usage += len(ref.offsets(window)) + 2
    assert r.json()["usage"]["prompt_tokens"] == usage  # every window's tokens, context included


@pytest.mark.parametrize(
    "chunking, extra, status, param, message",
    [
        (
            {"size": 300, "late": True},
            {},
            400,
            None,
            "chunking.size is 300; this model holds at most 254 tokens of text a chunk",
        ),
        ({"size": 64, "late": "yes"}, {}, 400, "chunking.late", "'chunking.late' must be true or false"),
        (
            {"size": 64, "late": True},
            {"dimensions": 1000},
            400,
            "dimensions",
            "'dimensions' 1000 exceeds the model's 384",
        ),
    ],
    ids=["over-room", "not-a-boolean", "dimensions"],
)
def test_wrong_late_chunking_is_refused_in_the_openai_shape(stack, texts, chunking, extra, status, param, message):
    r = _embed(stack, texts, chunking, **extra)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"].startswith(message), error
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_a_window_that_alone_tokenizes_otherwise_is_refused_naming_its_input(stack):
    """Chunks of 4 tokens cut 8-token words into pieces, each tokenized alone: a window holding a piece's
    edge reads the word otherwise (whole, or from that edge as a word of its own); its count differs
    from its spans', so it is refused, never pooled from shifted spans."""
    long = "Short words fit. " + "antidisestablishmentarianism " * 60  # ~490 tokens: several windows
    r = _embed(stack, ["fine", long], {"size": 4, "late": True})
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_request", error
    assert error["message"].startswith("input 1 makes ") and "content tokens, where its spans count" in error["message"]
    # one window holding pieces of a word cut for size 4 (each tokenized alone: "establishment", not
    # "##est ##ab ##lish ##ment"): its count differs too, refused
    assert _embed(stack, ["fine", long[:200]], {"size": 4, "late": True}).status_code == 400
    # the same text with chunks that hold its words whole: taken
    assert _embed(stack, ["fine", long[:200]], {"size": 16, "late": True}).status_code == 200


def test_a_binary_answer_takes_the_late_mean_and_refuses_chunk_offsets(stack, texts):
    url, body = f"{stack.base_url}/v1/embeddings", {"model": MODEL, "input": texts}
    octet = {"accept": "application/octet-stream"}
    mean = httpx.post(
        url, json={**body, "chunking": {"size": 64, "late": True, "return": "mean"}}, headers=octet, timeout=120
    )
    assert mean.status_code == 200 and len(mean.content) == 2 * 384 * 4, mean.text[:300]
    chunks = httpx.post(url, json={**body, "chunking": {"size": 64, "late": True}}, headers=octet, timeout=120)
    assert chunks.status_code == 400 and chunks.json()["error"]["param"] == "chunking", chunks.text


def test_the_docs_late_example_is_answered_as_it_says(stack, ref):
    """docs/http-api.md's late-chunking curl, its body sent as written: a vector per chunk, pooled in context."""
    import json
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "http-api.md").read_text()
    bodies = re.findall(r"curl -s localhost:8080/v1/embeddings [^\n]*-d '(\{[^']*\"chunking\"[^']*)'", page)
    (body,) = [b for b in bodies if '"late": true' in b]
    sent = json.loads(body)
    r = httpx.post(f"{stack.base_url}/v1/embeddings", json=sent, timeout=120)
    assert r.status_code == 200, r.text
    items = r.json()["data"]
    text = sent["input"][0]
    assert len(items) > 1 and [d["chunk"] for d in items] == list(range(len(items)))
    spans = [ref.tokens(text, d["start"], d["end"]) for d in items]
    got = np.array([d["embedding"] for d in items], np.float32)
    assert cosines(got, ref.chunk_vectors(text, spans)).min() >= COSINE_TOLERANCE
