"""Cohere's API through the real services with Cohere's own SDK: Client (v1 /v1/embed, /v1/rerank)
and ClientV2 (/v2/embed, /v2/rerank), against sentence-transformers, the quantize rule and the
/v1/rerank answer."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import cohere
import httpx
import numpy as np
import pytest

from embedfleet.shared.nats.server import free_port
from embedfleet.shared.vectors.quantize import quantize
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import mixed_texts
from tests.support.procs import Service, count_services, healthy, wait_until
from tests.support.tiny_models import st_reference

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"
DIM = 384
LIMIT = 256  # the model's tokens per input
QUERY = "how do I read a file line by line"
# an input far past the limit, whose start and end differ
LONG = " ".join(mixed_texts(16)[:7]) + " the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return mixed_texts(24)  # one whole help topic in eight: cut at 256 tokens (Cohere's default, END)


@pytest.fixture(scope="module")
def expected(reference, texts) -> np.ndarray:
    return reference.encode(texts)


@pytest.fixture(scope="module")
def v1(stack) -> cohere.Client:
    return cohere.Client(api_key="unused", base_url=stack.base_url, timeout=120)


@pytest.fixture(scope="module")
def v2(stack) -> cohere.ClientV2:
    return cohere.ClientV2(api_key="unused", base_url=stack.base_url, timeout=120)


def _close(got, want) -> None:
    c = cosines(np.asarray(got, np.float32), np.asarray(want, np.float32))
    assert c.min() >= COSINE_TOLERANCE, f"worst cosine {c.min():.6f} at {c.argmin()}"


def _tokens(reference, texts: list[str]) -> int:
    return sum(len(ids) for ids in reference.tokenizer(texts, truncation=True, max_length=LIMIT)["input_ids"])


def _within_a_step(a: np.ndarray, b: np.ndarray) -> None:
    """int8 rows of the same texts from two requests: floats from two batches may differ in the last
    bits, so a component may round one step apart; nearly all are equal."""
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.999, (diff.max(), (diff == 0).mean())


def test_v1_embed_answers_floats_like_sentence_transformers(v1, reference, texts, expected):
    r = v1.embed(texts=texts, model=MODEL, input_type="search_document")
    assert r.response_type == "embeddings_floats"
    assert r.texts == texts and len(r.id) > 0
    assert np.array(r.embeddings).shape == (len(texts), DIM)
    _close(r.embeddings, expected)
    assert r.meta.api_version.version == "1"
    assert r.meta.billed_units.input_tokens == _tokens(reference, texts)


def test_v1_several_types_in_one_request(v1, texts, expected):
    """One float32 answer from the worker, each other type quantized from it by the worker's rule:
    the same request's float rows give exactly the same bytes."""
    r = v1.embed(texts=texts, model=MODEL, embedding_types=["float", "int8", "uint8", "binary", "ubinary"])
    assert r.response_type == "embeddings_by_type"
    floats = np.array(r.embeddings.float_, np.float32)
    _close(floats, expected)
    for form in ("int8", "uint8", "binary", "ubinary"):
        got = np.array(getattr(r.embeddings, form))
        assert got.shape == (len(texts), DIM // 8 if "binary" in form else DIM), form
        assert np.array_equal(got, quantize(floats, form).astype(np.int64)), form


@pytest.mark.parametrize("form", ["int8", "uint8", "binary", "ubinary"])
def test_v1_one_type_is_made_on_the_worker(v1, texts, form):
    floats = np.array(v1.embed(texts=texts, model=MODEL).embeddings, np.float32)
    r = v1.embed(texts=texts, model=MODEL, embedding_types=[form])
    assert r.embeddings.float_ is None
    got = np.array(getattr(r.embeddings, form))
    want = quantize(floats, form)
    if "binary" in form:  # sign bits; a component this close to 0 may take either sign in another batch
        clear = np.abs(floats) > 1e-4
        packed = (got + 128 if form == "binary" else got).astype(np.uint8)
        assert np.array_equal(np.unpackbits(packed, axis=1).astype(bool)[clear], (floats > 0)[clear])
    else:
        _within_a_step(got.astype(want.dtype), want)


def test_v2_embed_types_and_base64(v2, reference, texts, expected):
    r = v2.embed(
        texts=texts[:8], model=MODEL, input_type="search_query", embedding_types=["float", "ubinary", "base64"]
    )
    floats = np.array(r.embeddings.float_, np.float32)
    _close(floats, expected[:8])
    assert np.array_equal(np.array(r.embeddings.ubinary), quantize(floats, "ubinary").astype(np.int64))
    decoded = np.stack([np.frombuffer(base64.b64decode(s), "<f4") for s in r.embeddings.base64])
    np.testing.assert_array_equal(decoded, floats)  # float32's bytes
    assert r.embeddings.int8 is None and r.texts == texts[:8]
    assert r.meta.api_version.version == "2" and r.meta.billed_units.input_tokens == _tokens(reference, texts[:8])


def test_v2_inputs_are_the_texts(v2, texts, expected):
    inputs = [cohere.EmbedInput(content=[cohere.TextEmbedContent(text=t)]) for t in texts[:4]]
    r = v2.embed(inputs=inputs, model=MODEL, input_type="clustering", embedding_types=["float"])
    _close(r.embeddings.float_, expected[:4])


def test_v2_output_dimension_is_matryoshka(v2, texts, expected):
    r = v2.embed(
        texts=texts[:6],
        model=MODEL,
        input_type="search_document",
        output_dimension=100,
        embedding_types=["float", "int8"],
    )
    short = np.array(r.embeddings.float_, np.float32)
    assert short.shape == (6, 100)
    np.testing.assert_allclose(np.linalg.norm(short, axis=1), 1.0, atol=1e-5)  # renormalised
    _close(short, expected[:6, :100])
    assert np.array_equal(np.array(r.embeddings.int8), quantize(short, "int8").astype(np.int64))  # the range of 100
    with pytest.raises(cohere.BadRequestError) as err:
        v2.embed(texts=["x"], model=MODEL, input_type="search_document", output_dimension=DIM + 1)
    assert err.value.status_code == 400 and err.value.body == {
        "message": "'output_dimension' 385 exceeds the model's 384"
    }


def test_truncate_none_refuses_and_start_keeps_the_end(v1, v2, reference, stack):
    with pytest.raises(cohere.BadRequestError) as err:
        v1.embed(texts=["short", LONG], model=MODEL, truncate="NONE")
    assert err.value.status_code == 400
    assert list(err.value.body) == ["message"] and f"the model's limit is {LIMIT}" in err.value.body["message"]
    with pytest.raises(cohere.BadRequestError):
        v2.embed(texts=[LONG], model=MODEL, input_type="search_document", truncate="NONE")

    end = v1.embed(texts=[LONG], model=MODEL, truncate="END").embeddings
    _close(end, reference.encode([LONG]))  # sentence-transformers cuts the end
    start = v2.embed(
        texts=[LONG], model=MODEL, input_type="search_document", truncate="START", embedding_types=["float"]
    ).embeddings.float_
    ids = reference.tokenizer(LONG, add_special_tokens=False)["input_ids"]
    tail = httpx.post(
        f"{stack.base_url}/v1/embeddings", json={"model": MODEL, "input": [101, *ids[-(LIMIT - 2) :], 102]}, timeout=60
    )
    assert tail.status_code == 200, tail.text
    _close(start, [tail.json()["data"][0]["embedding"]])  # the input's last tokens
    assert cosines(np.array(start), np.array(end))[0] < 0.99


def test_v2_max_tokens_below_the_models_limit_is_refused(v2, texts, expected):
    r = v2.embed(texts=texts[:3], model=MODEL, input_type="search_document", max_tokens=4096, embedding_types=["float"])
    _close(r.embeddings.float_, expected[:3])
    with pytest.raises(cohere.BadRequestError) as err:
        v2.embed(texts=["x"], model=MODEL, input_type="search_document", max_tokens=64)
    assert "below the model's limit of 256 tokens" in err.value.body["message"]


def test_errors_are_the_sdks(v1, v2):
    with pytest.raises(cohere.NotFoundError) as err:
        v2.embed(texts=["x"], model="embed-english-v3.0", input_type="search_document")
    assert err.value.status_code == 404 and "not served here" in err.value.body["message"]
    with pytest.raises(cohere.BadRequestError) as err:
        v1.embed(texts=["x"], model=MODEL, input_type="photo")
    assert "'input_type' must be one of" in err.value.body["message"]
    with pytest.raises(cohere.BadRequestError):
        v2.rerank(model=MODEL, query="", documents=["a"])


def test_v2_rerank_ranks_as_v1_rerank_and_the_reference(v2, stack, reference):
    docs = mixed_texts(30)
    r = v2.rerank(model=MODEL, query=QUERY, documents=docs, top_n=7, max_tokens_per_doc=4096)
    got = [(x.index, x.relevance_score) for x in r.results]
    assert len(got) == 7 and r.id and r.meta.api_version.version == "2"
    old = httpx.post(
        f"{stack.base_url}/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": docs, "top_n": 7}, timeout=60
    )
    assert old.status_code == 200, old.text
    want = [(x["index"], x["relevance_score"]) for x in old.json()["results"]]
    assert [i for i, _ in got] == [i for i, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], atol=1e-5)
    q = reference.encode([QUERY], normalize_embeddings=True)[0]
    cos = reference.encode(docs, normalize_embeddings=True) @ q
    np.testing.assert_allclose([s for _, s in got], np.sort(cos)[::-1][:7], atol=1e-4)
    np.testing.assert_allclose([s for _, s in got], cos[[i for i, _ in got]], atol=1e-4)
    with pytest.raises(cohere.BadRequestError) as err:
        v2.rerank(model=MODEL, query=QUERY, documents=docs, max_tokens_per_doc=16)
    assert "'max_tokens_per_doc' 16 is below" in err.value.body["message"]


def test_v1_sdk_rerank_reaches_v1_rerank(v1, reference):
    docs = mixed_texts(10)
    r = v1.rerank(model=MODEL, query=QUERY, documents=docs, top_n=3, return_documents=True)
    q = reference.encode([QUERY], normalize_embeddings=True)[0]
    cos = reference.encode(docs, normalize_embeddings=True) @ q
    assert [x.index for x in r.results] == list(np.argsort(-cos)[:3])
    assert r.results[0].document.text == docs[r.results[0].index]


PREFIX = "cohere-prompts"
PROMPTS = {"query": "query: ", "document": "passage: "}


@pytest.fixture(scope="module")
def prompted(nats_url, model_info, tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """The same model with prompts named query and document, on its own subjects and gateway."""
    folder = tmp_path_factory.mktemp("prompted") / "minilm-prompts"
    shutil.copytree(model_info.path, folder)
    config = folder / "config_sentence_transformers.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "prompts": PROMPTS}))
    log_dir = tmp_path_factory.mktemp("prompted-logs")
    common = ["--nats", nats_url, "--subject-prefix", PREFIX]
    port = free_port()
    services = [
        Service("tokenizer", [*common, "--model", str(folder)], log_dir),
        Service(
            "worker", [*common, "--model", str(folder), "--max-batch-tokens", "1024"], log_dir, {"OMP_NUM_THREADS": "1"}
        ),
        Service("gateway", [*common, "--port", str(port)], log_dir),
    ]
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthy(base_url), 120, "gateway health", services)
        wait_until(lambda: count_services(nats_url, "worker", prefix=PREFIX) == 1, 60, "the worker", services)
        yield base_url, folder
    finally:
        for s in services:
            s.stop()


@pytest.mark.parametrize(
    "input_type, prompt", [("search_query", "query"), ("search_document", "document"), ("classification", None)]
)  # the folder has no prompt of that name
def test_input_type_selects_the_models_prompt(prompted, texts, input_type, prompt):
    base_url, folder = prompted
    client = cohere.ClientV2(api_key="unused", base_url=base_url, timeout=120)
    r = client.embed(texts=texts[:6], model="minilm-prompts", input_type=input_type, embedding_types=["float"])
    _close(r.embeddings.float_, st_reference(folder, texts[:6], prompt_name=prompt))
    if prompt is not None:  # the prompt changes the vectors
        assert cosines(np.array(r.embeddings.float_), st_reference(folder, texts[:6])).min() < 0.9999
