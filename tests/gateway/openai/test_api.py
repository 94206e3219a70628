import base64

import numpy as np
import orjson
import pytest

from embedfleet.services.gateway.http.errors import TABLE, ApiError
from embedfleet.services.gateway.inputs import Limits
from embedfleet.services.gateway.openai.api import parse_embeddings_request, render_embeddings
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.vectors.forms import FORMS
from embedfleet.shared.vectors.quantize import quantize

LIMITS = Limits(max_inputs=10, max_input_chars=100)


def _parse(doc):
    return parse_embeddings_request(orjson.dumps(doc), LIMITS)


def test_string_and_list_inputs():
    r = _parse({"model": "m", "input": "hi"})
    assert (r.texts, r.encoding_format, r.dimensions) == (["hi"], "float", None)
    r = _parse(
        {
            "model": "m",
            "input": ["a", "b"],
            "encoding_format": "base64",
            "dimensions": 8,
            "user": "u",
            "input_type": "query",
        }
    )
    assert (r.texts, r.encoding_format, r.dimensions, r.input_type) == (["a", "b"], "base64", 8, "query")
    assert r.inputs.token_ids is None


def test_token_id_inputs():
    one = _parse({"model": "m", "input": [101, 7592, 102]})
    assert one.texts == [] and [t.tolist() for t in one.inputs.token_ids] == [[101, 7592, 102]]
    many = _parse({"model": "m", "input": [[101, 102], [101, 5, 102]]})
    assert [t.tolist() for t in many.inputs.token_ids] == [[101, 102], [101, 5, 102]]
    assert many.inputs.count == 2


@pytest.mark.parametrize(
    "body, param, message",
    [
        (b"{not json", None, "not valid JSON"),
        (b"[1]", None, "must be a JSON object"),
        (orjson.dumps({"input": "x"}), "model", "'model' is required"),
        (orjson.dumps({"model": "m"}), "input", "'input' is required"),
        (orjson.dumps({"model": "m", "input": []}), "input", "must not be an empty list"),
        (orjson.dumps({"model": "m", "input": ["a", None]}), "input", "'input[1]' must be a string, got null"),
        (orjson.dumps({"model": "m", "input": {"a": 1}}), "input", "got object"),
        (
            orjson.dumps({"model": "m", "input": "a", "encoding_format": "hex"}),
            "encoding_format",
            "'float' or 'base64'",
        ),
        (
            orjson.dumps({"model": "m", "input": "a", "dimensions": 0}),
            "dimensions",
            "'dimensions' must be at least 1, got 0",
        ),
        (orjson.dumps({"model": "m", "input": "a", "dimensions": True}), "dimensions", "must be an integer"),
        (orjson.dumps({"model": "m", "input": "a", "user": 5}), "user", "'user' must be a string"),
        (orjson.dumps({"model": "m", "input": "a", "input_type": "passage"}), "input_type", "'query' or 'document'"),
        (orjson.dumps({"model": "m", "input": [[101], []]}), "input", "non-empty list of token IDs"),
        (orjson.dumps({"model": "m", "input": [[101], "x"]}), "input", "non-empty list of token IDs"),
        (
            orjson.dumps({"model": "m", "input": "a", "embedding_type": "int4"}),
            "embedding_type",
            (
                "'embedding_type' must be one of 'float', 'float32', 'float16', 'int8', 'uint8', 'binary' or "
                "'ubinary', got 'int4'"
            ),
        ),
        (orjson.dumps({"model": "m", "input": "a", "embedding_type": ["int8"]}), "embedding_type", "must be one of"),
        (orjson.dumps({"model": "m", "input": "a", "embedding_type": "INT8"}), "embedding_type", "must be one of"),
    ],
)
def test_invalid_requests(body, param, message):
    with pytest.raises(ApiError) as err:
        parse_embeddings_request(body, LIMITS)
    assert err.value.status == 400 and err.value.code is ErrorCode.INVALID_REQUEST
    assert err.value.param == param
    assert message in err.value.message
    body = orjson.loads(err.value.response().body)
    assert set(body["error"]) == {"message", "type", "param", "code"}


def test_render_float_and_base64_agree():
    vectors = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    as_float = orjson.loads(render_embeddings("m", vectors, 11, "float"))
    as_b64 = orjson.loads(render_embeddings("m", vectors, 11, "base64"))
    assert as_float["usage"] == {"prompt_tokens": 11, "total_tokens": 11}
    assert [d["index"] for d in as_float["data"]] == [0, 1, 2]
    np.testing.assert_array_equal(np.array([d["embedding"] for d in as_float["data"]], np.float32), vectors)
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in as_b64["data"]])
    np.testing.assert_array_equal(decoded, vectors)


@pytest.mark.parametrize(
    "name, form",
    [
        (None, "float32"),
        ("float", "float32"),
        ("float32", "float32"),
        ("float16", "float16"),
        ("int8", "int8"),
        ("uint8", "uint8"),
        ("binary", "binary"),
        ("ubinary", "ubinary"),
    ],
)
def test_embedding_type_names_a_form(name, form):
    doc = {"model": "m", "input": "a", "dimensions": 64} | ({} if name is None else {"embedding_type": name})
    r = _parse(doc)
    assert (r.embedding_type, r.dimensions) == (form, 64)


# dim 20: the bit-packed rows end in a byte holding 4 bits
@pytest.mark.parametrize("form", list(FORMS))
def test_render_each_form_as_numbers_and_as_base64(form):
    floats = np.random.default_rng(1).standard_normal((3, 20)).astype(np.float32)
    floats /= np.linalg.norm(floats, axis=1, keepdims=True)
    stored = quantize(floats, form)
    assert stored.shape == (3, FORMS[form].width(20))
    as_numbers = orjson.loads(render_embeddings("m", stored, 7, "float", form))
    rows = [d["embedding"] for d in as_numbers["data"]]
    assert all(len(row) == stored.shape[1] for row in rows)
    if form in ("float32", "float16"):
        np.testing.assert_array_equal(np.array(rows, np.float32), stored.astype(np.float32))
    else:  # JSON integers, the stored values themselves (binary's bytes in -128..127, as Cohere sends them)
        assert all(type(x) is int for row in rows for x in row)
        assert np.array_equal(np.array(rows), stored.astype(np.int64))
    as_b64 = orjson.loads(render_embeddings("m", stored, 7, "base64", form))
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), FORMS[form].dtype) for d in as_b64["data"]])
    assert decoded.dtype == FORMS[form].dtype and np.array_equal(decoded, stored)
    assert len(base64.b64decode(as_b64["data"][0]["embedding"])) == stored.shape[1] * stored.itemsize


def test_binary_rows_render_the_bytes_cohere_sends():
    # components 0..7 -> one byte, first component in its highest bit: + - + + - - - + = 0b10110001 = 177
    floats = np.array([[0.5, -0.1, 0.2, 0.3, -0.4, -0.5, -0.6, 0.7]], np.float32)
    ubinary = orjson.loads(render_embeddings("m", quantize(floats, "ubinary"), 1, "float", "ubinary"))
    binary = orjson.loads(render_embeddings("m", quantize(floats, "binary"), 1, "float", "binary"))
    assert ubinary["data"][0]["embedding"] == [177] and binary["data"][0]["embedding"] == [177 - 128]


@pytest.mark.parametrize(
    "doc, status, fragment",
    [
        ({"model": "m", "input": "x" * 101}, 413, "101 characters; the limit is 100"),
        ({"model": "m", "input": ["a"] * 11}, 422, "has 11 items; the limit is 10"),
        ({"model": "m", "input": [101, -1]}, 422, "not a token ID"),
        ({"model": "m", "input": [[101], [1.5]]}, 422, "not a token ID"),
    ],
)
def test_limits_and_token_errors(doc, status, fragment):
    with pytest.raises(ApiError) as err:
        _parse(doc)
    assert err.value.status == status and fragment in err.value.message


def test_every_error_code_has_a_status():
    assert set(TABLE) == set(ErrorCode)


def test_the_docs_curl_examples_are_requests_the_route_takes():
    """Every curl to /v1/embeddings in the README and docs/ sends a body the route accepts (names its model)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    calls = [m for page in pages for m in re.finditer(r"curl [^`]*?/v1/embeddings[^`]*?-d '([^']*)'", page.read_text())]
    assert len(calls) >= 2  # the quick start's and the deploy section's
    for call in calls:
        assert _parse(orjson.loads(call.group(1))).model == "all-MiniLM-L6-v2", call.group(0)
