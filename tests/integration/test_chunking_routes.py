"""Long texts cut into chunks on TEI's POST /embed and Cohere's POST /v2/embed, through the processes:
each chunk's vector against sentence-transformers' encode of the chunk's text (cosine >=
COSINE_TOLERANCE), the chunks covering each input where /v1/embeddings puts them, each mean against the
token-weighted mean of the reference's chunk vectors, every /embed option and every Cohere embedding
type per chunk, refusals in each route's own shape and status, and the examples of docs/http-api.md as typed.

A stack of its own: its tokenizer has prompts (the room a prompt leaves is checked) and a small
--max-chunks (a request past it is cheap to make)."""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgpack
import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from embedfleet.shared.nats.server import free_port
from embedfleet.shared.vectors.quantize import quantize
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.integration.test_chunking import _content_tokens
from tests.support.corpus import long_texts
from tests.support.procs import Service, count_services, healthy, post, wait_until

pytestmark = pytest.mark.integration

PREFIX = "chunkroutes"  # subjects of its own: no other stack of the session answers
MODEL = "all-MiniLM-L6-v2"
DIM = 384
PROMPTS = {"query": "query: ", "document": "passage: "}  # 2 tokens each
MAX_CHUNKS = 64
SPEC = {"size": 64, "overlap": 16}
TYPES = ["float", "int8", "uint8", "binary", "ubinary", "base64"]


@pytest.fixture(scope="module")
def base_url(nats_url: str, tmp_path_factory) -> Iterator[str]:
    log_dir = tmp_path_factory.mktemp("chunk-routes-logs")
    common = ["--nats", nats_url, "--subject-prefix", PREFIX]
    port = free_port()
    services = [
        Service("tokenizer", [*common, "--prompts", json.dumps(PROMPTS), "--max-chunks", str(MAX_CHUNKS)], log_dir),
        Service("worker", [*common, "--max-batch-tokens", "2048"], log_dir, {"OMP_NUM_THREADS": "1"}),
        Service("gateway", [*common, "--port", str(port), "--request-timeout", "120"], log_dir),
    ]
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthy(url), 120, "gateway health", services)
        wait_until(lambda: count_services(nats_url, "worker", prefix=PREFIX) == 1, 60, "the worker", services)
        yield url
    finally:
        for s in services:
            s.stop()


@pytest.fixture(scope="module")
def texts() -> list[str]:
    # some 650 tokens (a dozen windows of SPEC), non-ASCII first: offsets count characters, not bytes
    return ["Crème brûlée, naïve café: 我爱北京. " + long_texts(1)[0][:2600], "A short query that fits one window."]


@pytest.fixture(scope="module")
def places(base_url, texts) -> list[dict]:
    """Where /v1/embeddings cuts ``texts`` by SPEC: each route cuts them there."""
    r = post(base_url, "/v1/embeddings", {"model": MODEL, "input": texts, "chunking": SPEC})
    assert r.status_code == 200, r.text
    return [{k: d[k] for k in ("index", "chunk", "start", "end")} for d in r.json()["data"]]


@pytest.fixture(scope="module")
def raw_reference(reference) -> SentenceTransformer:
    """The reference without its Normalize module: TEI's normalize false."""
    return SentenceTransformer(modules=[reference[0], reference[1]], device="cpu")


def _pieces(texts: list[str], places: list[dict]) -> list[str]:
    return [texts[p["index"]][p["start"] : p["end"]] for p in places]


def _check_cover(reference, texts: list[str], places: list[dict], size: int) -> None:
    """Each input's chunks: numbered from 0, at most ``size`` tokens each, from the text's start to its
    end, each starting after the one before and no later than it ends (no gap)."""
    assert sorted({p["index"] for p in places}) == list(range(len(texts)))
    for i, text in enumerate(texts):
        mine = [p for p in places if p["index"] == i]
        assert [p["chunk"] for p in mine] == list(range(len(mine)))
        starts, ends = [p["start"] for p in mine], [p["end"] for p in mine]
        assert starts[0] == 0 and ends[-1] == len(text.rstrip()), (starts[:3], ends[-3:])
        assert all(a < b for a, b in itertools.pairwise(starts)) and all(s <= e for s, e in zip(starts[1:], ends))
    assert all(_content_tokens(reference, p) <= size for p in _pieces(texts, places))


def _mean(reference, texts: list[str], places: list[dict], vectors: np.ndarray, normalize: bool = True) -> np.ndarray:
    """[inputs, dim]: each input's chunk ``vectors`` (rows as ``places``) weighted by the chunk's tokens."""
    weights = np.array([_content_tokens(reference, p) for p in _pieces(texts, places)], np.float64)
    index = np.array([p["index"] for p in places])
    out = np.stack(
        [
            weights[index == i] @ vectors[index == i].astype(np.float64) / weights[index == i].sum()
            for i in range(len(texts))
        ]
    )
    return out / np.linalg.norm(out, axis=1, keepdims=True) if normalize else out


def _close(got, want, norms: bool = False) -> None:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape, (got.shape, want.shape)
    c = cosines(got, want)
    assert c.min() >= COSINE_TOLERANCE, f"worst cosine {c.min():.6f} at {c.argmin()}"
    if norms:  # not normalised: the lengths are the reference's too
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(want, axis=1), rtol=1e-3)


def _same_form(got, floats: np.ndarray, form: str) -> None:
    """Rows of ``form`` as ``floats`` quantize (floats from another batch: a step apart at most, a sign bit
    differing only where a component is all but 0)."""
    got, want = np.asarray(got), quantize(floats, form)
    assert got.shape == want.shape, (form, got.shape, want.shape)
    if "binary" in form:
        clear = np.abs(floats) > 1e-4
        packed = (got + 128 if form == "binary" else got).astype(np.uint8)
        assert np.array_equal(np.unpackbits(packed, axis=1).astype(bool)[clear], (floats > 0)[clear]), form
    else:
        diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
        assert diff.max() <= 1 and (diff == 0).mean() >= 0.99, (form, diff.max(), (diff == 0).mean())


# -- TEI: POST /embed ---------------------------------------------------------------------------


def _tei_places(answer: list) -> list[dict]:
    return [
        {"index": i, **{k: c[k] for k in ("chunk", "start", "end")}} for i, chunks in enumerate(answer) for c in chunks
    ]


def test_tei_chunks_are_the_vectors_of_their_texts_per_input(base_url, reference, texts, places):
    r = post(base_url, "/embed", {"inputs": texts, "chunking": SPEC})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert len(answer) == len(texts) and all(
        set(c) == {"chunk", "start", "end", "embedding"} for cs in answer for c in cs
    )
    assert _tei_places(answer) == places and len(answer[0]) > 5 and len(answer[1]) == 1
    _check_cover(reference, texts, places, SPEC["size"])
    _close([c["embedding"] for cs in answer for c in cs], reference.encode(_pieces(texts, places)))
    assert "x-inference-time" in r.headers


def test_tei_mean_is_a_vector_per_input_in_teis_shape(base_url, reference, texts, places):
    r = post(base_url, "/embed", {"inputs": texts, "chunking": {**SPEC, "return": "mean"}})
    assert r.status_code == 200, r.text
    got = np.array(r.json(), np.float32)  # TEI's own answer: a list of vectors
    assert got.shape == (len(texts), DIM)
    _close(got, _mean(reference, texts, places, reference.encode(_pieces(texts, places))))
    # the one-window input's mean is its chunk, which is the input
    _close(got[1:], reference.encode(texts[1:]))


@pytest.mark.parametrize(
    "option",
    [
        {"normalize": False},
        {"dimensions": 128},
        {"prompt_name": "query"},
        {"embedding_type": "int8"},
        {"truncate": True, "truncation_direction": "Left"},
    ],
    ids=["normalize", "dimensions", "prompt_name", "embedding_type", "truncate"],
)
def test_tei_options_apply_to_each_chunk_and_to_the_mean(base_url, reference, raw_reference, texts, places, option):
    pieces = _pieces(texts, places)
    model = raw_reference if option.get("normalize") is False else reference
    want = model.encode(pieces, prompt=PROMPTS.get(option.get("prompt_name")))
    if "dimensions" in option:
        want = want[:, : option["dimensions"]] / np.linalg.norm(want[:, : option["dimensions"]], axis=1, keepdims=True)
    normalize = option.get("normalize", True)
    chunks = post(base_url, "/embed", {"inputs": texts, "chunking": SPEC, **option})
    mean = post(base_url, "/embed", {"inputs": texts, "chunking": {**SPEC, "return": "mean"}, **option})
    assert chunks.status_code == 200 and mean.status_code == 200, (chunks.text, mean.text)
    assert _tei_places(chunks.json()) == places  # the prompt's two tokens fit beside 64
    rows = [c["embedding"] for cs in chunks.json() for c in cs]
    if "embedding_type" in option:
        _same_form(rows, want, "int8")
        _same_form(mean.json(), _mean(reference, texts, places, want).astype(np.float32), "int8")
        return
    _close(rows, want, norms=not normalize)
    _close(mean.json(), _mean(reference, texts, places, want, normalize), norms=not normalize)
    if not normalize:
        assert np.abs(np.linalg.norm(np.array(rows), axis=1) - 1).min() > 0.05  # really not normalised


def test_tei_binary_answers_take_the_mean_and_refuse_chunk_offsets(base_url, texts):
    body = {"inputs": texts, "chunking": {**SPEC, "return": "mean"}}
    floats = np.array(post(base_url, "/embed", body).json(), np.float32)
    octet = post(base_url, "/embed", body, headers={"accept": "application/octet-stream"})
    assert octet.status_code == 200 and octet.headers["x-embedding-rows"] == "2", octet.text[:300]
    np.testing.assert_allclose(np.frombuffer(octet.content, "<f4").reshape(2, DIM), floats, atol=1e-6)
    packed = post(base_url, "/embed", body, headers={"accept": "application/msgpack"})
    assert msgpack.unpackb(packed.content)["shape"] == [2, DIM]
    refused = post(base_url, "/embed", {**body, "chunking": SPEC}, headers={"accept": "application/octet-stream"})
    assert refused.status_code == 400 and refused.json() == {
        "error": "a binary answer has no room for the chunks' offsets: ask for JSON, or for 'chunking.return' 'mean' "
        "(a vector per input)",
        "error_type": "Validation",
    }


def test_post_root_embeds_chunked_as_embed(base_url, texts, places):
    """POST / runs /embed for an embedder: its chunking too."""
    r = post(base_url, "/", {"inputs": texts, "chunking": SPEC})
    assert r.status_code == 200, r.text
    assert _tei_places(r.json()) == places


# -- Cohere: POST /v2/embed ---------------------------------------------------------------------


def test_cohere_chunks_are_rows_of_every_type_with_their_places(base_url, reference, texts, places):
    r = post(base_url, "/v2/embed", {"model": MODEL, "texts": texts, "embedding_types": TYPES, "chunking": SPEC})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["chunks"] == places and body["texts"] == texts and body["response_type"] == "embeddings_by_type"
    pieces = _pieces(texts, places)
    tokens = sum(_content_tokens(reference, p) + 2 for p in pieces)  # every chunk's [CLS] and [SEP] too
    assert body["meta"]["billed_units"] == {"input_tokens": tokens}
    got = body["embeddings"]
    assert list(got) == TYPES and all(len(got[t]) == len(places) for t in TYPES)
    floats = np.array(got["float"], np.float32)
    _close(floats, reference.encode(pieces))
    for form in ("int8", "uint8", "binary", "ubinary"):  # quantized from these float rows: the same bytes
        assert np.array_equal(np.array(got[form]), quantize(floats, form).astype(np.int64)), form
    np.testing.assert_array_equal(np.stack([np.frombuffer(base64.b64decode(s), "<f4") for s in got["base64"]]), floats)


@pytest.mark.parametrize("kind", TYPES[1:])
def test_cohere_one_type_made_on_the_worker_per_chunk(base_url, reference, texts, places, kind):
    r = post(base_url, "/v2/embed", {"model": MODEL, "texts": texts, "embedding_types": [kind], "chunking": SPEC})
    assert r.status_code == 200, r.text
    assert r.json()["chunks"] == places and list(r.json()["embeddings"]) == [kind]
    rows, want = r.json()["embeddings"][kind], reference.encode(_pieces(texts, places))
    if kind == "base64":
        _close([np.frombuffer(base64.b64decode(s), "<f4") for s in rows], want)
    else:
        _same_form(rows, want, kind)


def test_cohere_mean_keeps_cohere_shape_for_every_type(base_url, reference, texts, places):
    r = post(
        base_url,
        "/v2/embed",
        {"model": MODEL, "texts": texts, "embedding_types": TYPES, "chunking": {**SPEC, "return": "mean"}},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "response_type", "embeddings", "texts", "meta"} and body["texts"] == texts
    mean = _mean(reference, texts, places, reference.encode(_pieces(texts, places))).astype(np.float32)
    got = body["embeddings"]
    _close(got["float"], mean)
    for form in ("int8", "uint8", "binary", "ubinary"):
        _same_form(got[form], mean, form)
    _close([np.frombuffer(base64.b64decode(s), "<f4") for s in got["base64"]], mean)
    one = post(
        base_url,
        "/v2/embed",
        {"model": MODEL, "texts": texts, "embedding_types": ["uint8"], "chunking": {**SPEC, "return": "mean"}},
    )
    _same_form(one.json()["embeddings"]["uint8"], mean, "uint8")  # averaged in float32, then made uint8


def test_cohere_input_type_and_output_dimension_apply_to_each_chunk(base_url, reference, texts, places):
    r = post(
        base_url,
        "/v2/embed",
        {
            "model": MODEL,
            "texts": texts,
            "input_type": "search_query",
            "output_dimension": 100,
            "embedding_types": ["float"],
            "chunking": SPEC,
        },
    )
    assert r.status_code == 200, r.text
    want = reference.encode(_pieces(texts, places), prompt=PROMPTS["query"])[:, :100]
    got = np.array(r.json()["embeddings"]["float"], np.float32)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # renormalised
    _close(got, want)


def test_cohere_sdk_reads_the_chunks_extension(base_url, reference, texts, places):
    import cohere

    client = cohere.ClientV2(api_key="unused", base_url=base_url, timeout=120)
    r = client.embed(
        texts=texts,
        model=MODEL,
        input_type="search_document",
        embedding_types=["float"],
        request_options={"additional_body_parameters": {"chunking": SPEC}},
    )
    assert r.chunks == places
    _close(r.embeddings.float_, reference.encode(_pieces(texts, places), prompt=PROMPTS["document"]))


@pytest.mark.parametrize(
    "texts, spec",
    [
        ([np.floor_divide.__doc__], {"size": 100, "overlap": 20}),  # code text, as reported
        (["a supercalifragilisticexpialidocious word, 0x7f3a9c2e1b4d8f6a5c3e9b1d7f2a4c6e"], {"size": 5, "overlap": 0}),
    ],
    ids=["code", "long-words"],
)
def test_chunks_hold_their_texts_tokens_and_the_mean_weighs_them(base_url, reference, texts, spec):
    """Each chunk's text alone holds at most ``size`` tokens (words longer than that cut into pieces), and
    the mean is the mean of the chunks' texts' vectors weighted by those texts' tokens."""
    chunks = post(base_url, "/v1/embeddings", {"model": MODEL, "input": texts, "chunking": spec})
    mean = post(base_url, "/v1/embeddings", {"model": MODEL, "input": texts, "chunking": {**spec, "return": "mean"}})
    assert chunks.status_code == 200 and mean.status_code == 200, (chunks.text, mean.text)
    places = [{k: d[k] for k in ("index", "chunk", "start", "end")} for d in chunks.json()["data"]]
    starts, ends = [p["start"] for p in places], [p["end"] for p in places]
    assert starts[0] == 0 and ends[-1] == len(texts[0].rstrip())  # in order over the text (no overlap across
    assert all(a < b for a, b in itertools.pairwise(starts)) and all(a < b for a, b in itertools.pairwise(ends))
    assert all(_content_tokens(reference, p) <= spec["size"] for p in _pieces(texts, places))  # a word's pieces)
    want = reference.encode(_pieces(texts, places))
    _close([d["embedding"] for d in chunks.json()["data"]], want)
    _close([d["embedding"] for d in mean.json()["data"]], _mean(reference, texts, places, want))


def test_texts_without_tokens_are_a_chunk_each_on_both_routes(base_url, reference):
    """An empty or blank text is one chunk of no tokens, (0, 0): its vector is the empty text's, and its
    mean (no tokens to weigh by) that same vector."""
    texts = ["", "  \n ", "word"]
    want = reference.encode(["", "", "word"])
    tei = post(base_url, "/embed", {"inputs": texts, "chunking": SPEC})
    assert tei.status_code == 200, tei.text
    assert _tei_places(tei.json()) == [{"index": i, "chunk": 0, "start": 0, "end": e} for i, e in enumerate((0, 0, 4))]
    _close([c["embedding"] for cs in tei.json() for c in cs], want)
    cohere = post(base_url, "/v2/embed", {"model": MODEL, "texts": texts, "chunking": {**SPEC, "return": "mean"}})
    assert cohere.status_code == 200, cohere.text
    _close(cohere.json()["embeddings"]["float"], want)


# -- refusals, each in its route's shape ----------------------------------------------------------


@pytest.mark.parametrize(
    "chunking, extra, statuses, message",
    [
        ({"size": 300}, {}, (400, 400), "chunking.size is 300; this model holds at most 254 tokens of text a chunk"),
        (
            {"size": 253},
            {"prompt_name": "query", "input_type": "search_query"},
            (400, 400),
            "chunking.size is 253; this model holds at most 252 tokens",
        ),
        ({"size": 8, "overlap": 8}, {}, (400, 400), "chunking.overlap (8) must be less than chunking.size (8)"),
        ({"size": 64, "stride": 3}, {}, (400, 400), "'chunking' has unknown keys 'stride'"),
        # every typed body words a type fault alike
        ({"size": "64"}, {}, (400, 400), "'chunking.size' must be an integer, got '64'"),
        ({"size": 64, "return": "all"}, {}, (400, 400), "'chunking.return' must be 'chunks' or 'mean'"),
        ([64], {}, (400, 400), "'chunking' must be an object"),
        # Cohere has no 413: it answers what is too long with 400
        ({"size": 4}, {}, (413, 400), f"input 0 takes the request past {MAX_CHUNKS} chunks"),
    ],
    ids=[
        "over-room",
        "over-room-with-prompt",
        "overlap",
        "unknown-key",
        "size-type",
        "return",
        "not-object",
        "too-many-chunks",
    ],
)
def test_wrong_chunking_is_refused_in_each_routes_shape(base_url, texts, chunking, extra, statuses, message):
    tei = post(
        base_url,
        "/embed",
        {"inputs": texts, "chunking": chunking, **{k: v for k, v in extra.items() if k == "prompt_name"}},
    )
    assert tei.status_code == statuses[0], tei.text
    assert set(tei.json()) == {"error", "error_type"} and tei.json()["error_type"] == "Validation"
    assert tei.json()["error"].startswith(message), tei.json()
    cohere = post(
        base_url,
        "/v2/embed",
        {"model": MODEL, "texts": texts, "chunking": chunking, **{k: v for k, v in extra.items() if k == "input_type"}},
    )
    assert cohere.status_code == statuses[1], cohere.text
    assert set(cohere.json()) == {"message"} and cohere.json()["message"].startswith(message), cohere.json()


def test_late_chunking_answers_on_every_route_as_on_v1_embeddings(base_url, texts):
    """`late` goes through the one chunked path: what /v1/embeddings answers, the others answer."""
    chunking = {**SPEC, "late": True}
    openai = post(base_url, "/v1/embeddings", {"model": MODEL, "input": texts, "chunking": chunking})
    tei = post(base_url, "/embed", {"inputs": texts, "chunking": chunking})
    cohere = post(base_url, "/v2/embed", {"model": MODEL, "texts": texts, "chunking": chunking})
    assert openai.status_code == tei.status_code == cohere.status_code == 200, (openai.text, tei.text, cohere.text)
    _close([c["embedding"] for cs in tei.json() for c in cs], [d["embedding"] for d in openai.json()["data"]])
    _close(cohere.json()["embeddings"]["float"], [d["embedding"] for d in openai.json()["data"]])


def test_token_ids_cannot_be_chunked_on_embed(base_url):
    r = post(base_url, "/embed", {"inputs": [[101, 2000, 102]], "chunking": SPEC})
    assert r.status_code == 400 and r.json() == {
        "error": "'chunking' cuts texts: give 'inputs' as text, not token IDs",
        "error_type": "Validation",
    }


# -- docs/http-api.md's examples, as a reader types them ----------------------------------------


def _docs_section() -> str:
    page = (Path(__file__).resolve().parents[2] / "docs" / "http-api.md").read_text()
    return page.split("## Long documents: chunking", 1)[1].split("\n## ", 1)[0]


def test_the_docs_tei_curl_runs_as_written(base_url):
    (command,) = re.findall(r"^curl -s localhost:8080/embed .*$", _docs_section(), re.M)
    done = subprocess.run(
        ["bash", "-c", command.replace("localhost:8080", base_url.removeprefix("http://"))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (chunks,) = json.loads(done.stdout)  # one input, "a long document ...": one window
    assert [(c["chunk"], c["start"], c["end"], len(c["embedding"])) for c in chunks] == [(0, 0, 19, DIM)]


def test_the_docs_cohere_example_runs_as_written(base_url, tmp_path):
    (example,) = [block for block in re.findall(r"```python\n(.*?)```", _docs_section(), re.S) if "cohere" in block]
    done = subprocess.run(
        [sys.executable, "-c", example.replace("http://localhost:8080", base_url)],
        cwd=tmp_path,
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "0", "0", "19", str(DIM)], done.stdout
