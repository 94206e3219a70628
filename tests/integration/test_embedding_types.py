"""Quantized forms over HTTP (``embedding_type``), through NATS, the tokenizer and two workers: each
form compared with the float rows the same route answers for the same texts."""

from __future__ import annotations

import base64

import httpx
import msgpack
import numpy as np
import openai
import pytest

from embedfleet.shared.vectors.forms import FORMS
from embedfleet.shared.vectors.quantize import dequantize, quantize
from tests.conftest import cosines
from tests.support.corpus import mixed_texts

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"
DIM = 384
INT8_COSINE = 0.99  # an int8 / uint8 row against its float row
NEAR_ZERO = 1e-4  # a float component this close to 0 may take either sign in another batch


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return mixed_texts(48)


def _embed(stack, texts: list[str], timeout: float = 120, **fields) -> httpx.Response:
    r = httpx.post(f"{stack.base_url}/v1/embeddings", json={"model": MODEL, "input": texts, **fields}, timeout=timeout)
    assert r.status_code == 200, r.text
    return r


def _rows(r: httpx.Response) -> list:
    body = r.json()
    assert [d["index"] for d in body["data"]] == list(range(len(body["data"])))
    return [d["embedding"] for d in body["data"]]


def _ints(r: httpx.Response, form: str) -> np.ndarray:
    """The JSON rows of an integer form: integers, in the form's range."""
    rows = _rows(r)
    assert all(type(x) is int for row in rows for x in row)
    info = np.iinfo(FORMS[form].dtype)
    assert min(map(min, rows)) >= info.min and max(map(max, rows)) <= info.max
    return np.array(rows, dtype=FORMS[form].dtype)


def _signs(stored: np.ndarray, form: str, dim: int) -> np.ndarray:
    """[n, dim] bool: the sign bits of bit-packed rows (first component in a byte's highest bit)."""
    packed = (stored.astype(np.int16) + 128).astype(np.uint8) if form == "binary" else stored.astype(np.uint8)
    return np.unpackbits(packed, axis=1)[:, :dim].astype(bool)


def _assert_signs_match(stored: np.ndarray, form: str, floats: np.ndarray) -> None:
    clear = np.abs(floats) > NEAR_ZERO
    signs = _signs(stored, form, floats.shape[1])
    assert np.array_equal(signs[clear], (floats > 0)[clear]), f"{(signs != (floats > 0))[clear].sum()} bits differ"


def _assert_within_a_step(a: np.ndarray, b: np.ndarray) -> None:
    """int8 / uint8 rows of the same texts from two requests: floats from two batches may differ in the
    last bits, so a component may round one step apart; nearly all are equal."""
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.999, (diff.max(), (diff == 0).mean())


@pytest.fixture(scope="module")
def floats(stack, texts) -> np.ndarray:
    """The float route's answer: what every form is checked against."""
    got = np.array(_rows(_embed(stack, texts)), np.float32)
    assert got.shape == (len(texts), DIM)
    return got


def test_int8_rows_keep_the_float_rows_direction(stack, texts, floats):
    """Cosine on the raw int8 values (int8 scales every component of a row by one factor, so its
    direction needs no dequantizing) against the float route's rows."""
    got = _ints(_embed(stack, texts, embedding_type="int8"), "int8")
    assert got.shape == (len(texts), DIM)
    assert cosines(got.astype(np.float32), floats).min() >= INT8_COSINE
    _assert_within_a_step(got, quantize(floats, "int8"))  # the rule of shared/vectors/quantize.py, made on the worker


def test_uint8_rows_dequantized_keep_the_float_rows_direction(stack, texts, floats):
    """uint8 is offset by 127.5: cosine after shared/quantize.dequantize."""
    got = _ints(_embed(stack, texts, embedding_type="uint8"), "uint8")
    assert got.shape == (len(texts), DIM)
    assert cosines(dequantize(got, "uint8", DIM), floats).min() >= INT8_COSINE
    _assert_within_a_step(got, quantize(floats, "uint8"))


@pytest.mark.parametrize("form", ["binary", "ubinary"])
def test_each_bit_is_the_sign_of_the_float_component(stack, texts, floats, form):
    got = _ints(_embed(stack, texts, embedding_type=form), form)
    assert got.shape == (len(texts), DIM // 8)  # 48 bytes a vector: 1/32 of float32's 1536
    _assert_signs_match(got, form, floats)


def test_binary_is_ubinary_shifted_by_128(stack, texts):
    binary = _ints(_embed(stack, texts[:8], embedding_type="binary"), "binary")
    ubinary = _ints(_embed(stack, texts[:8], embedding_type="ubinary"), "ubinary")
    assert np.array_equal(binary.astype(np.int16) + 128, ubinary.astype(np.int16))


def test_float16_rows_are_the_float_rows_rounded(stack, texts, floats):
    got = np.array(_rows(_embed(stack, texts, embedding_type="float16")), np.float32)
    assert got.shape == (len(texts), DIM)
    assert np.array_equal(got.astype(np.float16).astype(np.float32), got)  # each value is a float16
    np.testing.assert_allclose(got, floats, atol=2e-3)


@pytest.mark.parametrize("form", ["float16", "int8", "uint8", "binary", "ubinary"])
def test_base64_decodes_to_the_json_numbers(stack, texts, floats, form):
    numbers = np.array(_rows(_embed(stack, texts, embedding_type=form)))
    encoded = _rows(_embed(stack, texts, embedding_type=form, encoding_format="base64"))
    decoded = np.stack([np.frombuffer(base64.b64decode(row), FORMS[form].dtype) for row in encoded])
    assert decoded.shape == numbers.shape
    if form == "float16":
        np.testing.assert_allclose(decoded.astype(np.float32), numbers, atol=1e-3)
    elif form in ("int8", "uint8"):
        _assert_within_a_step(decoded, numbers.astype(FORMS[form].dtype))
    else:
        _assert_signs_match(decoded, form, floats)
        _assert_signs_match(numbers.astype(FORMS[form].dtype), form, floats)


def test_forms_with_matryoshka_dimensions(stack, texts):
    """dimensions 100: truncated and renormalised on the worker, then quantized; 100 bits pack into 13
    bytes, the last holding 4."""
    short = np.array(_rows(_embed(stack, texts, dimensions=100)), np.float32)
    assert short.shape == (len(texts), 100)
    int8 = _ints(_embed(stack, texts, dimensions=100, embedding_type="int8"), "int8")
    assert int8.shape == (len(texts), 100)
    assert cosines(int8.astype(np.float32), short).min() >= INT8_COSINE
    _assert_within_a_step(int8, quantize(short, "int8"))  # the range of 100 components, not of 384
    ubinary = _ints(_embed(stack, texts, dimensions=100, embedding_type="ubinary"), "ubinary")
    assert ubinary.shape == (len(texts), 13)
    _assert_signs_match(ubinary, "ubinary", short)
    assert not (ubinary[:, -1] & 0x0F).any()  # the 4 bits past the 100th component are 0


def test_msgpack_and_octet_carry_the_forms_dtype_and_shape(stack, texts):
    json_int8 = _ints(_embed(stack, texts[:6], embedding_type="int8"), "int8")
    r = httpx.post(
        f"{stack.base_url}/v1/embeddings",
        json={"model": MODEL, "input": texts[:6], "embedding_type": "int8"},
        headers={"accept": "application/msgpack"},
        timeout=60,
    )
    assert r.status_code == 200 and r.headers["content-type"] == "application/msgpack"
    body = msgpack.unpackb(r.content)
    assert (body["rows"], body["dim"], body["shape"], body["embedding_type"]) == (6, DIM, [6, DIM], "int8")
    assert np.dtype(body["dtype"]) == np.int8
    _assert_within_a_step(np.frombuffer(body["data"], body["dtype"]).reshape(body["shape"]), json_int8)

    r = httpx.post(
        f"{stack.base_url}/v1/embeddings",
        json={"model": MODEL, "input": texts[:6], "embedding_type": "binary", "dimensions": 100},
        headers={"accept": "application/octet-stream"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert (
        r.headers["x-embedding-rows"],
        r.headers["x-embedding-dim"],
        r.headers["x-embedding-dtype"],
        r.headers["x-embedding-row-bytes"],
    ) == ("6", "100", "binary", "13")
    assert len(r.content) == 6 * 13


def test_tei_embed_takes_embedding_type(stack, texts, floats):
    r = httpx.post(f"{stack.base_url}/embed", json={"inputs": texts[:6], "embedding_type": "ubinary"}, timeout=60)
    assert r.status_code == 200, r.text
    rows = r.json()
    assert all(type(x) is int for row in rows for x in row)
    _assert_signs_match(np.array(rows, np.uint8), "ubinary", floats[:6])
    r = httpx.post(
        f"{stack.base_url}/embed",
        json={"inputs": texts[:6], "embedding_type": "int8"},
        headers={"accept": "application/msgpack"},
        timeout=60,
    )
    body = msgpack.unpackb(r.content)
    assert (body["shape"], body["embedding_type"], np.dtype(body["dtype"])) == ([6, DIM], "int8", np.int8)


def test_openai_client_with_extra_body(stack, texts, floats):
    """The client asks for base64 and decodes it as float32 unless told a format: with another
    embedding_type, say encoding_format (float: numbers; base64: the string, decoded here)."""
    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    numbers = client.embeddings.create(
        model=MODEL, input=texts[:8], encoding_format="float", extra_body={"embedding_type": "int8"}
    )
    int8 = np.array([d.embedding for d in numbers.data])
    assert int8.shape == (8, DIM) and np.array_equal(int8, np.rint(int8)) and np.abs(int8).max() <= 127
    assert cosines(int8, floats[:8]).min() >= INT8_COSINE
    encoded = client.embeddings.create(
        model=MODEL, input=texts[:8], encoding_format="base64", extra_body={"embedding_type": "ubinary"}
    )
    ubinary = np.stack([np.frombuffer(base64.b64decode(d.embedding), np.uint8) for d in encoded.data])
    assert ubinary.shape == (8, DIM // 8)
    _assert_signs_match(ubinary, "ubinary", floats[:8])


@pytest.mark.parametrize(
    "route, body, error",
    [
        (
            "/v1/embeddings",
            {"model": MODEL, "input": "x", "embedding_type": "int4"},
            {
                "message": "'embedding_type' must be one of 'float', 'float32', 'float16', 'int8', 'uint8', 'binary' "
                "or 'ubinary', got 'int4'",
                "type": "invalid_request_error",
                "param": "embedding_type",
                "code": "invalid_request",
            },
        ),
        (
            "/embed",
            {"inputs": "x", "embedding_type": 8},
            {
                "error": "'embedding_type' must be one of 'float', 'float32', 'float16', 'int8', 'uint8', 'binary' "
                "or 'ubinary', got 8",
                "error_type": "Validation",
            },
        ),
    ],
)
def test_bad_embedding_type_is_refused_in_the_routes_shape(stack, route, body, error):
    r = httpx.post(f"{stack.base_url}{route}", json=body, timeout=30)
    assert r.status_code == 400
    assert r.json() == ({"error": error} if route == "/v1/embeddings" else error)
