"""HTTP in, vectors out, through NATS, the tokenizer and two workers: compared with sentence-transformers."""

from __future__ import annotations

import asyncio
import base64

import httpx
import numpy as np
import openai
import pytest

from embedfleet.services.gateway.http.health_answers import Healthy
from embedfleet.services.gateway.openai.answers import ModelList, OpenAIEmbeddings
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.nats.embed_client import EmbedClient
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import EmbedOptions
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import mixed_texts

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return mixed_texts(240)


@pytest.fixture(scope="module")
def expected(reference, texts) -> np.ndarray:
    return reference.encode(texts, batch_size=32)


@pytest.fixture(scope="module")
def expected_tokens(reference, texts) -> int:
    ids = reference.tokenizer(texts, truncation=True, max_length=reference.max_seq_length)["input_ids"]
    return sum(len(i) for i in ids)


def _assert_close(vectors: np.ndarray, expected: np.ndarray) -> None:
    assert vectors.shape == expected.shape
    c = cosines(vectors, expected)
    assert c.min() >= COSINE_TOLERANCE, f"worst cosine {c.min():.6f} at input {c.argmin()}"


def test_texts_are_mixed_and_some_exceed_the_limit(reference, texts):
    lengths = [len(i) for i in reference.tokenizer(texts)["input_ids"]]
    assert len(texts) >= 200
    assert min(lengths) < 10 and sum(n > 256 for n in lengths) >= 20


def test_float_json_matches_reference(stack, texts, expected, expected_tokens):
    r = httpx.post(f"{stack.base_url}/v1/embeddings", json={"model": MODEL, "input": texts}, timeout=120)
    assert r.status_code == 200, r.text
    OpenAIEmbeddings.model_validate_json(r.content)  # the answer /openapi.json describes, strictly
    body = r.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert [d["index"] for d in body["data"]] == list(range(len(texts)))
    assert all(d["object"] == "embedding" for d in body["data"])
    assert body["usage"] == {"prompt_tokens": expected_tokens, "total_tokens": expected_tokens}
    _assert_close(np.array([d["embedding"] for d in body["data"]], np.float32), expected)


def test_openai_client_base64_default(stack, texts, expected, expected_tokens):
    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    # the client asks for base64 unless told otherwise, and decodes it to floats
    result = client.embeddings.create(model=f"sentence-transformers/{MODEL}", input=texts)
    assert result.usage.prompt_tokens == expected_tokens
    _assert_close(np.array([d.embedding for d in result.data], np.float32), expected)


def test_openai_client_float_and_single_string(stack, texts, expected):
    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    result = client.embeddings.create(model=MODEL, input=texts[5], encoding_format="float")
    assert len(result.data) == 1
    _assert_close(np.array([result.data[0].embedding], np.float32), expected[5:6])


def test_base64_payload_is_little_endian_float32(stack, texts, expected):
    r = httpx.post(
        f"{stack.base_url}/embeddings",
        json={"model": MODEL, "input": texts[:3], "encoding_format": "base64"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    OpenAIEmbeddings.model_validate_json(r.content)
    rows = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in r.json()["data"]]
    _assert_close(np.stack(rows), expected[:3])


def test_dimensions_truncate_and_renormalise(stack, texts, expected):
    r = httpx.post(
        f"{stack.base_url}/v1/embeddings", json={"model": MODEL, "input": texts[:8], "dimensions": 128}, timeout=60
    )
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
    assert got.shape == (8, 128)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    _assert_close(got, expected[:8, :128])


def test_many_inputs_split_across_workers_come_back_in_order(stack, reference):
    texts = [f"query number {i}: {w}" for i, w in enumerate(mixed_texts(300))]
    texts = [t[:200] for t in texts]
    r = httpx.post(f"{stack.base_url}/v1/embeddings", json={"model": MODEL, "input": texts}, timeout=300)
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
    _assert_close(got, reference.encode(texts, batch_size=64))
    for name in ("worker-1", "worker-2"):
        assert stack.services[name].alive


def test_models_and_health(stack):
    answer = httpx.get(f"{stack.base_url}/v1/models")
    ModelList.model_validate_json(answer.content)  # what the live processes register, as /openapi.json says
    models = answer.json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [MODEL]
    health = httpx.get(f"{stack.base_url}/health")
    assert health.status_code == 200 and health.json()["models"] == [MODEL]
    Healthy.model_validate_json(health.content)  # the answer is its documented model, strictly


BAD_REQUESTS = [
    # (body, content, status, param, message fragment)
    (None, b"this is not json", 400, None, "not valid JSON"),
    ({"model": MODEL}, None, 400, "input", "'input' is required"),
    ({"model": MODEL, "input": []}, None, 400, "input", "must not be an empty list"),
    ({"model": MODEL, "input": ["ok", 3]}, None, 400, "input", "'input[1]' must be a string"),
    ({"model": MODEL, "input": "x", "encoding_format": "hex"}, None, 400, "encoding_format", "'float' or 'base64'"),
    ({"model": "no-such-model", "input": "x"}, None, 404, "model", "not served here"),
    ({"model": MODEL, "input": "x", "dimensions": 4096}, None, 400, "dimensions", "exceeds the model's 384"),
]


@pytest.mark.parametrize("body, content, status, param, fragment", BAD_REQUESTS)
def test_bad_input_gets_openai_error_and_stack_keeps_serving(stack, body, content, status, param, fragment):
    r = httpx.post(f"{stack.base_url}/v1/embeddings", json=body, content=content, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and fragment in error["message"]
    assert "Traceback" not in r.text
    ok = httpx.post(f"{stack.base_url}/v1/embeddings", json={"model": MODEL, "input": "still alive"}, timeout=30)
    assert ok.status_code == 200


def test_unknown_route_and_method_use_the_error_shape(stack):
    r = httpx.get(f"{stack.base_url}/v2/nothing")
    assert r.status_code == 404 and r.json()["error"]["message"] == "Not Found"
    r = httpx.get(f"{stack.base_url}/v1/embeddings")
    assert r.status_code == 405 and "error" in r.json()


def test_no_responders_fails_at_once(stack):
    async def run() -> ServiceError:
        import nats

        nc = await nats.connect(stack.nats_url)
        client = EmbedClient(nc, Subjects("nobody-listens"))
        await client.start()
        try:
            with pytest.raises(ServiceError) as err:
                await asyncio.wait_for(client.embed(MODEL, ["x"], EmbedOptions(), timeout=30), 5)
            return err.value
        finally:
            await nc.close()

    assert asyncio.run(run()).code is ErrorCode.NO_RESPONDERS


def test_output_options_travel_to_the_worker(stack, texts, expected):
    """normalize off, float16 little-endian, Matryoshka dimensions: carried by the request itself."""

    async def run(options: EmbedOptions) -> np.ndarray:
        import nats

        nc = await nats.connect(stack.nats_url)
        client = EmbedClient(nc, Subjects())
        await client.start()
        try:
            return (await client.embed(MODEL, texts[:40], options, timeout=60)).vectors
        finally:
            await nc.close()

    raw = asyncio.run(run(EmbedOptions(normalize=False)))
    assert raw.dtype == np.dtype("<f4")
    norms = np.linalg.norm(raw, axis=1)
    assert norms.min() > 0 and np.abs(norms - 1).max() > 0.05  # really not normalised
    _assert_close(raw, expected[:40])  # same direction as the reference

    half = asyncio.run(run(EmbedOptions(dtype="f2", dimensions=64)))
    assert half.dtype == np.dtype("<f2") and half.shape == (40, 64)
    np.testing.assert_allclose(np.linalg.norm(half.astype(np.float32), axis=1), 1.0, atol=2e-3)
    c = cosines(half.astype(np.float32), expected[:40, :64])
    assert c.min() >= 0.999, c.min()  # float16 rounding


def test_quantized_forms_are_made_on_the_worker(stack, texts, expected):
    """int8, uint8, binary and ubinary rows from the worker over NATS: the reference's vectors quantized
    by the same rule (shared/vectors/quantize.py), and as few bytes as the form says."""
    from embedfleet.shared.vectors.quantize import dequantize, quantize

    async def run(dtype: str) -> tuple[np.ndarray, int]:
        import nats

        nc = await nats.connect(stack.nats_url)
        client = EmbedClient(nc, Subjects())
        await client.start()
        try:
            result = await client.embed(MODEL, texts[:40], EmbedOptions(dtype=dtype), timeout=60)
            return result.vectors, result.vectors.nbytes
        finally:
            await nc.close()

    want = expected[:40]
    dim = want.shape[1]
    for wire, form in (("i1", "int8"), ("u1", "uint8")):
        got, nbytes = asyncio.run(run(wire))
        assert got.dtype == quantize(want, form).dtype and got.shape == (40, dim) and nbytes == 40 * dim
        # rounding may land one step apart where the two floats straddle a step
        assert np.abs(got.astype(np.int16) - quantize(want, form).astype(np.int16)).max() <= 1
        assert cosines(dequantize(got, form, dim), want).min() >= 0.99
    for wire, form in (("b1", "binary"), ("ub1", "ubinary")):
        got, nbytes = asyncio.run(run(wire))
        assert got.shape == (40, dim // 8) and nbytes == 40 * dim // 8  # 1/32 of float32's bytes
        signs = dequantize(got, form, dim) > 0
        clear = np.abs(want) > 1e-4  # a component this close to 0 may take either sign
        assert np.array_equal(signs[clear], (want > 0)[clear])


def test_the_quick_start_python_snippet_runs_as_typed(stack, reference, tmp_path):
    """The README's quick start block for Python, through bash as a newcomer types it beside `make run`:
    the client installed into the project's .venv (this Python's venv), the snippet run by its Python;
    it prints what its comment says (only the README's port 8080 becomes the stack's)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    quick = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    [block] = [b for b in re.findall(r"^```sh\n(.*?)^```$", quick, re.M | re.S) if "from openai import" in b]
    assert block.startswith(".venv/bin/pip install openai\n"), block  # the client is no dependency of embedfleet
    printed = re.search(r"print\(.*\)  # (\S+)", block).group(1)
    (tmp_path / ".venv").symlink_to(sys.prefix)
    port = stack.base_url.rsplit(":", 1)[1]
    run = subprocess.run(
        ["bash", "-e", "-c", block.replace("127.0.0.1:8080", f"127.0.0.1:{port}")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines()[-1] == printed == str(reference.get_sentence_embedding_dimension()), run.stdout[
        -500:
    ]
