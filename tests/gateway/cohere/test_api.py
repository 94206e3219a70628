import base64

import numpy as np
import orjson
import pytest

from embedfleet.services.gateway.chunking import Chunking
from embedfleet.services.gateway.cohere.api import (
    check_model_limits,
    parse_embed,
    parse_rerank,
    render_embed,
    render_rerank,
)
from embedfleet.services.gateway.http.errors import ApiError, error_response
from embedfleet.services.gateway.inputs import Limits
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.protocol import EmbedOptions
from embedfleet.shared.text_chunks import ChunkSpec, TextChunk
from embedfleet.shared.vectors.forms import FORMS
from embedfleet.shared.vectors.quantize import quantize

LIMITS = Limits(max_inputs=4, max_input_chars=50)


def _parse(doc: dict, version: int = 1):
    return parse_embed(orjson.dumps(doc), LIMITS, version)


def _unit_rows(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_v1_defaults_cut_the_end_and_answer_plain_floats():
    r = _parse({"texts": ["a", "b"]})
    assert (r.version, r.model, r.inputs.texts, r.types, r.input_type, r.dimensions) == (
        1,
        None,
        ["a", "b"],
        None,
        None,
        None,
    )
    assert r.form == "float32"
    assert r.options() == EmbedOptions(dtype="f4", truncate=True, truncation_direction="right")


@pytest.mark.parametrize(
    "cohere, prompt",
    [
        ("search_query", "query"),
        ("search_document", "document"),
        ("classification", "classification"),
        ("clustering", "clustering"),
    ],
)
def test_input_type_names_the_models_prompt(cohere, prompt):
    assert _parse({"texts": ["a"], "input_type": cohere}).options().input_type == prompt


@pytest.mark.parametrize(
    "truncate, options",
    [
        ("END", {"truncate": True, "truncation_direction": "right"}),
        ("START", {"truncate": True, "truncation_direction": "left"}),
        ("NONE", {"truncate": False, "truncation_direction": "right"}),
    ],
)
def test_truncate_sides(truncate, options):
    got = _parse({"texts": ["a"], "truncate": truncate}).options()
    assert (got.truncate, got.truncation_direction) == (options["truncate"], options["truncation_direction"])


@pytest.mark.parametrize(
    "types, form",
    [
        (["float"], "float32"),
        (["int8"], "int8"),
        (["uint8"], "uint8"),
        (["binary"], "binary"),
        (["ubinary"], "ubinary"),
        (["base64"], "float32"),
        (["float", "base64"], "float32"),  # one form: made on the worker
        (["int8", "binary"], "float32"),
        (["uint8", "float"], "float32"),  # several: float32, quantized on the gateway
    ],
)
def test_the_worker_makes_the_types_one_form_or_float32(types, form):
    r = _parse({"texts": ["a"], "embedding_types": types})
    assert r.form == form and r.options().dtype == FORMS[form].wire


def test_v2_fields():
    r = _parse(
        {
            "model": "m",
            "texts": ["a"],
            "input_type": "search_document",
            "output_dimension": 64,
            "max_tokens": 512,
            "truncate": "START",
            "priority": 3,
        },
        version=2,
    )
    assert (r.model, r.types, r.dimensions, r.max_tokens, r.input_type) == ("m", ("float",), 64, 512, "document")
    assert (r.options().dimensions, r.options().truncation_direction) == (64, "left")
    inputs = _parse(
        {
            "inputs": [{"content": [{"type": "text", "text": "x"}]}, {"content": [{"type": "text", "text": "y"}]}],
            "embedding_types": ["int8", "int8", "float"],
        },
        version=2,
    )
    assert inputs.inputs.texts == ["x", "y"] and inputs.types == ("int8", "float")


def test_v1_ignores_v2_only_fields():
    r = _parse({"texts": ["a"], "output_dimension": 8, "max_tokens": 4, "inputs": "anything"})
    assert (r.dimensions, r.max_tokens, r.inputs.texts) == (None, None, ["a"])


@pytest.mark.parametrize(
    "doc, version, param, fragment",
    [
        ({}, 1, "texts", "'texts' is required"),
        ({}, 2, "texts", "'texts' is required (or 'inputs', or 'images')"),
        ({"texts": []}, 1, "texts", "must not be an empty list"),
        ({"texts": [1]}, 1, "texts", "'texts[0]' must be a string"),
        ({"texts": ["a"], "images": ["data:image/png;base64,AA=="]}, 1, "images", "served on /v2/embed"),
        ({"texts": ["a"], "images": ["data:image/png;base64,AA=="]}, 2, "images", "not both"),
        ({"images": ["data:image/png;base64,AA=="]}, 2, "images", "'images[0]': "),
        ({"texts": ["a"], "input_type": "photo"}, 1, "input_type", "must be one of 'search_query'"),
        ({"texts": ["a"], "input_type": "query"}, 2, "input_type", "must be one of"),
        ({"texts": ["a"], "truncate": "MIDDLE"}, 1, "truncate", "'NONE', 'START' or 'END'"),
        (
            {"texts": ["a"], "truncate": False},
            1,
            "truncate",
            "'truncate' must be one of 'NONE', 'START' or 'END', got false",
        ),
        ({"texts": ["a"], "embedding_types": []}, 1, "embedding_types", "'embedding_types' must not be an empty list"),
        (
            {"texts": ["a"], "embedding_types": "int8"},
            1,
            "embedding_types",
            "'embedding_types' must be a list, got 'int8'",
        ),
        (
            {"texts": ["a"], "embedding_types": ["int4"]},
            2,
            "embedding_types",
            "'embedding_types[0]' must be one of 'float', 'int8', 'uint8', 'binary', 'ubinary' or 'base64', got 'int4'",
        ),
        (
            {"texts": ["a"], "output_dimension": 0},
            2,
            "output_dimension",
            "'output_dimension' must be at least 1, got 0",
        ),
        ({"texts": ["a"], "output_dimension": 1.5}, 2, "output_dimension", "must be an integer"),
        ({"texts": ["a"], "max_tokens": 0}, 2, "max_tokens", "'max_tokens' must be at least 1, got 0"),
        ({"texts": ["a"], "inputs": [{"content": [{"type": "text", "text": "b"}]}]}, 2, "inputs", "not both"),
        ({"inputs": "a"}, 2, "inputs", "must be a list"),
        ({"inputs": [{"content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 2, "inputs", "one item"),
        (
            {"inputs": [{"content": [{"type": "image_url", "image_url": {"url": "data:,x"}}]}]},
            2,
            "inputs",
            "'inputs[0]': ",
        ),
        (
            {"inputs": [{"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
            2,
            "inputs",
            "one item",
        ),
        ({"inputs": []}, 2, "inputs", "must not be an empty list"),
    ],
)
def test_invalid_requests_answer_cohere_errors(doc, version, param, fragment):
    with pytest.raises(ApiError) as err:
        _parse(doc, version)
    assert (err.value.status, err.value.code, err.value.param) == (400, ErrorCode.INVALID_REQUEST, param)
    assert fragment in err.value.message
    answer = err.value.response(f"/v{version}/embed")
    assert answer.status_code == 400 and orjson.loads(answer.body) == {"message": err.value.message}


def test_limits_keep_their_status_but_over_long_is_400_in_cohere_shape():
    with pytest.raises(ApiError) as err:
        _parse({"texts": ["x" * 51]})
    assert err.value.status == 413  # the one table's status...
    answer = err.value.response("/v1/embed")
    assert (
        answer.status_code == 400 and "51 characters" in orjson.loads(answer.body)["message"]
    )  # ...as Cohere answers it
    assert err.value.response("/v1/embeddings").status_code == 413
    with pytest.raises(ApiError) as err:
        _parse({"texts": ["a"] * 5}, version=2)
    assert err.value.response("/v2/embed").status_code == 422


def test_check_model_limits():
    check_model_limits("max_tokens", None, 256)
    check_model_limits("max_tokens", 256, 256)
    check_model_limits("max_tokens", 4096, 256, dimensions=384, dim=384)
    check_model_limits("max_tokens", 8, 0)  # limit unknown: not checked
    with pytest.raises(ApiError, match="'max_tokens' 100 is below the model's limit of 256 tokens") as err:
        check_model_limits("max_tokens", 100, 256)
    assert err.value.param == "max_tokens"
    with pytest.raises(ApiError, match="'output_dimension' 385 exceeds the model's 384"):
        check_model_limits("max_tokens", None, 256, dimensions=385, dim=384)


def test_render_v1_floats():
    rows = _unit_rows(2, 6)
    r = _parse({"texts": ["a", "b"]})
    body = orjson.loads(render_embed(r, "req-1", rows, "float32", 9))
    assert body.keys() == {"id", "response_type", "embeddings", "texts", "meta"}
    assert (body["id"], body["response_type"], body["texts"]) == ("req-1", "embeddings_floats", ["a", "b"])
    assert body["meta"] == {"api_version": {"version": "1"}, "billed_units": {"input_tokens": 9}}
    np.testing.assert_array_equal(np.array(body["embeddings"], np.float32), rows)


def test_render_one_worker_made_form_as_is():
    rows = quantize(_unit_rows(3, 20), "binary")
    r = _parse({"texts": ["a", "b", "c"], "embedding_types": ["binary"]}, version=2)
    body = orjson.loads(render_embed(r, "x", rows, "binary", 3))
    assert body["response_type"] == "embeddings_by_type" and body["meta"]["api_version"] == {"version": "2"}
    assert list(body["embeddings"]) == ["binary"]
    got = body["embeddings"]["binary"]
    assert all(type(v) is int for row in got for v in row) and np.array_equal(np.array(got), rows.astype(np.int64))


def test_render_several_types_quantized_from_float32_by_the_workers_rule():
    floats = _unit_rows(3, 20, seed=1)
    types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    r = _parse({"texts": ["a", "b", "c"], "embedding_types": types})
    assert r.form == "float32"
    body = orjson.loads(render_embed(r, "x", floats, "float32", 3))
    got = body["embeddings"]
    assert list(got) == types and body["response_type"] == "embeddings_by_type"
    np.testing.assert_array_equal(np.array(got["float"], np.float32), floats)
    for form in ("int8", "uint8", "binary", "ubinary"):
        assert np.array_equal(np.array(got[form]), quantize(floats, form).astype(np.int64)), form
    assert len(got["binary"][0]) == 3  # 20 bits in 3 bytes
    decoded = np.stack([np.frombuffer(base64.b64decode(s), "<f4") for s in got["base64"]])
    np.testing.assert_array_equal(decoded, floats)


def test_rerank_parse_and_render():
    r = parse_rerank(
        orjson.dumps(
            {"model": "m", "query": "q", "documents": ["a", "b"], "top_n": 1, "max_tokens_per_doc": 4096, "priority": 0}
        ),
        LIMITS,
    )
    assert (r.call.model, r.call.query, r.call.texts, r.call.top_n, r.max_tokens_per_doc) == (
        "m",
        "q",
        ["a", "b"],
        1,
        4096,
    )
    assert (r.call.truncate, r.call.raw_scores, r.call.return_text) == (
        True,
        False,
        False,
    )  # documents are cut, as Cohere's
    body = orjson.loads(render_rerank("id-7", np.array([1, 0], np.int32), np.array([0.75, 0.5], np.float32)))
    assert body == {
        "id": "id-7",
        "results": [{"index": 1, "relevance_score": 0.75}, {"index": 0, "relevance_score": 0.5}],
        "meta": {"api_version": {"version": "2"}},
    }


@pytest.mark.parametrize(
    "doc, param, fragment",
    [
        ({"documents": ["a"]}, "query", "'query' is required"),
        ({"query": "", "documents": ["a"]}, "query", "'query' must not be an empty string"),
        ({"query": "q"}, "documents", "'documents' is required"),
        ({"query": "q", "documents": [{"text": "a"}]}, "documents", "'documents[0]' must be a string"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n", "'top_n' must be at least 1, got 0"),
        (
            {"query": "q", "documents": ["a"], "max_tokens_per_doc": -1},
            "max_tokens_per_doc",
            "'max_tokens_per_doc' must be at least 1, got -1",
        ),
        ({"query": "q", "documents": ["a"], "relevant_spans": {"mode": "on"}}, "relevant_spans", "not supported"),
    ],
)
def test_rerank_invalid_requests(doc, param, fragment):
    with pytest.raises(ApiError) as err:
        parse_rerank(orjson.dumps(doc), LIMITS)
    assert err.value.param == param and fragment in err.value.message
    assert orjson.loads(err.value.response("/v2/rerank").body) == {"message": err.value.message}


def test_errors_outside_the_handlers_answer_in_cohere_shape_on_cohere_paths():
    """A missing API key (the middleware) and unknown-route errors use the path's shape too."""
    for path in ("/v1/embed", "/v2/embed", "/v2/rerank"):
        answer = error_response(path, ErrorCode.UNAUTHORIZED, "missing or unknown API key")
        assert answer.status_code == 401 and orjson.loads(answer.body) == {"message": "missing or unknown API key"}
    assert "error" in orjson.loads(error_response("/v1/rerank", ErrorCode.UNAUTHORIZED, "no").body)


def test_v2_takes_chunking_and_v1_does_not_read_it():
    doc = {"texts": ["a"], "chunking": {"size": 16, "boundary": "sentence"}}
    assert _parse(doc, version=2).chunking == Chunking(ChunkSpec(16, 0, "sentence"))
    assert _parse(doc, version=1).chunking is None  # as output_dimension and max_tokens: v2's fields
    with pytest.raises(ApiError) as err:
        _parse({"texts": ["a"], "chunking": {"size": 16, "stride": 2}}, version=2)
    answer = err.value.response("/v2/embed")
    assert answer.status_code == 400 and orjson.loads(answer.body) == {"message": err.value.message}
    assert err.value.message.startswith("'chunking' has unknown keys 'stride'")


def test_render_chunk_rows_of_every_type_with_where_each_lies():
    floats = _unit_rows(3, 20, seed=2)
    types = ["float", "int8", "ubinary", "base64"]
    r = _parse({"texts": ["a long one", "b"], "embedding_types": types, "chunking": {"size": 4}}, version=2)
    chunks = [[TextChunk(0, 6, 0, 2), TextChunk(2, 10, 1, 3)], [TextChunk(0, 1, 0, 1)]]
    body = orjson.loads(render_embed(r, "x", floats, "float32", 11, chunks))
    assert body["chunks"] == [
        {"index": 0, "chunk": 0, "start": 0, "end": 6},
        {"index": 0, "chunk": 1, "start": 2, "end": 10},
        {"index": 1, "chunk": 0, "start": 0, "end": 1},
    ]
    assert body["texts"] == ["a long one", "b"] and body["meta"]["billed_units"] == {"input_tokens": 11}
    got = body["embeddings"]
    assert list(got) == types and all(len(got[t]) == 3 for t in types)
    np.testing.assert_array_equal(np.array(got["float"], np.float32), floats)
    for form in ("int8", "ubinary"):
        assert np.array_equal(np.array(got[form]), quantize(floats, form).astype(np.int64)), form
    np.testing.assert_array_equal(np.stack([np.frombuffer(base64.b64decode(s), "<f4") for s in got["base64"]]), floats)
    assert "chunks" not in orjson.loads(render_embed(r, "x", floats[:2], "float32", 3))  # a row per input
