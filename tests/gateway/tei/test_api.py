"""TEI's embedding routes' shapes (services/gateway/tei/api.py): /embed's defaults and extensions, its errors in
TEI's shape, /tokenize and /info rendered."""

import numpy as np
import orjson
import pytest

from embedfleet.services.gateway.chunking import Chunking
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Limits
from embedfleet.services.gateway.tei.api import (
    parse_embed,
    parse_tokenize,
    render_embed,
    render_embed_chunks,
    render_info,
    render_tokens,
)
from embedfleet.shared.protocol import TokenizeResult
from embedfleet.shared.text_chunks import ChunkSpec, TextChunk
from embedfleet.shared.vectors.forms import FORMS
from embedfleet.shared.vectors.quantize import quantize

LIMITS = Limits(max_inputs=4, max_input_chars=50)


def test_embed_defaults_follow_tei():
    r = parse_embed(orjson.dumps({"inputs": "hello"}), LIMITS)
    assert r.inputs.texts == ["hello"]
    assert (r.options.normalize, r.options.truncate, r.options.truncation_direction) == (True, False, "right")
    r = parse_embed(
        orjson.dumps(
            {
                "inputs": ["a", "b"],
                "normalize": False,
                "truncate": True,
                "truncation_direction": "Left",
                "prompt_name": "query",
                "dimensions": 16,
            }
        ),
        LIMITS,
    )
    assert (r.options.normalize, r.options.truncate, r.options.truncation_direction) == (False, True, "left")
    assert (r.options.prompt_name, r.options.dimensions) == ("query", 16)


@pytest.mark.parametrize(
    "doc, status, param, fragment",
    [
        ({}, 400, "inputs", "'inputs' is required"),
        ({"inputs": []}, 400, "inputs", "must not be an empty list"),
        ({"inputs": "a", "truncation_direction": "up"}, 400, "truncation_direction", "'Right' or 'Left', got 'up'"),
        ({"inputs": "a", "normalize": "yes"}, 400, "normalize", "'normalize' must be true or false, got 'yes'"),
        ({"inputs": ["a"] * 5}, 422, "inputs", "the limit is 4"),
        ({"inputs": "a", "embedding_type": "bits"}, 400, "embedding_type", "'embedding_type' must be one of"),
    ],
)
def test_embed_errors_in_tei_shape(
    doc, status, param, fragment
):  # TEI answers validation errors 4xx, error_type Validation
    with pytest.raises(ApiError) as err:
        parse_embed(orjson.dumps(doc), LIMITS)
    assert (err.value.status, err.value.param) == (status, param)
    body = orjson.loads(err.value.response("/embed").body)
    assert set(body) == {"error", "error_type"} and fragment in body["error"]
    assert body["error_type"] == "Validation"


def test_tokenize_request_and_rendering():
    r = parse_tokenize(orjson.dumps({"inputs": ["hi"], "add_special_tokens": False}), LIMITS)
    assert (r.texts, r.add_special_tokens, r.prompt_name) == (["hi"], False, None)
    with pytest.raises(ApiError):
        parse_tokenize(orjson.dumps({"inputs": [101]}), LIMITS)  # token IDs are not text to tokenize
    rows = orjson.loads(
        render_tokens(TokenizeResult("x", [[(101, "[CLS]", True, None, None), (7592, "hi", False, 0, 2)]]))
    )
    assert rows == [
        [
            {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None},
            {"id": 7592, "text": "hi", "special": False, "start": 0, "stop": 2},
        ]
    ]


def test_render_embed_and_info():
    v = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert orjson.loads(render_embed(v)) == v.tolist()
    info = orjson.loads(
        render_info(
            "m",
            {"max_seq_length": "256"},
            {"max_batch_tokens": "2048", "dtype": "float32", "pooling": "mean"},
            LIMITS,
            64,
            "0.1.0",
        )
    )
    assert info["model_id"] == "m" and info["max_input_length"] == 256 and info["max_batch_tokens"] == 2048
    assert info["model_type"] == {"embedding": {"pooling": "mean"}} and info["max_client_batch_size"] == 4


@pytest.mark.parametrize(
    "name, wire",
    [
        (None, "f4"),
        ("float", "f4"),
        ("float16", "f2"),
        ("int8", "i1"),
        ("uint8", "u1"),
        ("binary", "b1"),
        ("ubinary", "ub1"),
    ],
)
def test_embed_takes_embedding_type_as_an_extension(name, wire):
    doc = {"inputs": "a", "dimensions": 16} | ({} if name is None else {"embedding_type": name})
    assert parse_embed(orjson.dumps(doc), LIMITS).options.dtype == wire


def test_render_embed_keeps_integers_integers():
    floats = np.random.default_rng(2).standard_normal((2, 10)).astype(np.float32)
    for form in ("int8", "uint8", "binary", "ubinary"):
        stored = quantize(floats, form)
        rows = orjson.loads(render_embed(stored, form))
        assert rows == stored.tolist() and all(type(x) is int for row in rows for x in row)
    half = quantize(floats, "float16")
    np.testing.assert_array_equal(np.array(orjson.loads(render_embed(half, "float16")), np.float16), half)


def test_embed_takes_chunking_as_an_extension_and_refuses_it_on_token_ids():
    r = parse_embed(
        orjson.dumps(
            {"inputs": "a long text", "normalize": False, "chunking": {"size": 32, "overlap": 4, "return": "mean"}}
        ),
        LIMITS,
    )
    assert r.chunking == Chunking(ChunkSpec(32, 4), False, "mean") and r.options.normalize is False
    assert parse_embed(orjson.dumps({"inputs": "a"}), LIMITS).chunking is None
    for doc, param, fragment in [
        ({"inputs": [[101, 102]], "chunking": {"size": 8}}, "chunking", "give 'inputs' as text"),
        ({"inputs": "a", "chunking": {"size": 8, "overlap": 8}}, "chunking", "less than"),
        ({"inputs": "a", "chunking": {"size": 8, "return": "all"}}, "chunking.return", "'mean'"),
    ]:
        with pytest.raises(ApiError) as err:
            parse_embed(orjson.dumps(doc), LIMITS)
        assert err.value.param == param and fragment in err.value.message, err.value.message
        answer = err.value.response("/embed")
        assert answer.status_code == 400
        assert orjson.loads(answer.body) == {"error": err.value.message, "error_type": "Validation"}


@pytest.mark.parametrize("form", ["float32", "int8", "ubinary"])
def test_render_embed_chunks_lists_each_inputs_chunks_with_their_offsets(form):
    floats = np.random.default_rng(3).standard_normal((3, 16)).astype(np.float32)
    rows = quantize(floats, form)
    chunks = [[TextChunk(0, 10, 0, 3), TextChunk(8, 20, 2, 6)], [TextChunk(0, 4, 0, 1)]]
    got = orjson.loads(render_embed_chunks(rows, form, chunks))
    assert [[{k: v for k, v in c.items() if k != "embedding"} for c in one] for one in got] == [
        [{"chunk": 0, "start": 0, "end": 10}, {"chunk": 1, "start": 8, "end": 20}],
        [{"chunk": 0, "start": 0, "end": 4}],
    ]
    vectors = [c["embedding"] for one in got for c in one]
    np.testing.assert_array_equal(np.array(vectors, FORMS[form].dtype), rows)
    assert form == "float32" or all(type(v) is int for row in vectors for v in row)
