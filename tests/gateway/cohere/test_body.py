"""Cohere's /v1/embed and /v2/embed typed bodies: /openapi.json's request schemas are the models', they
name exactly the fields the routes read, what a schema accepts the route accepts; faults answer in
Cohere's error shape ({"message"}), naming the field."""

from __future__ import annotations

from typing import Any, get_args

import orjson
import pytest

from embedfleet.services.gateway import openapi
from embedfleet.services.gateway.chunking import Chunking
from embedfleet.services.gateway.cohere.api import INPUT_TYPES, TRUNCATE, parse_embed
from embedfleet.services.gateway.cohere.body import (
    CohereEmbedV1Body,
    CohereEmbedV2Body,
    EmbeddingTypes,
    InputType,
    Truncate,
)
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Limits
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.text_chunks import ChunkSpec
from embedfleet.shared.vectors.forms import COHERE_TYPES
from tests.gateway.typed_bodies import assert_served_is_generated, request_schema, served_spec, verdicts

LIMITS = Limits(max_inputs=4, max_input_chars=50)

# every field, none at its default: each changes what the route makes of the body
EVERY_V1: dict[str, Any] = {
    "model": "m",
    "texts": ["a long text", "another"],
    "input_type": "search_document",
    "task": "retrieval.passage",
    "embedding_types": ["int8", "float", "int8"],
    "truncate": "START",
    "images": [],  # read and checked: an empty list is as if absent
}
EVERY_V2: dict[str, Any] = {
    **{k: v for k, v in EVERY_V1.items() if k != "images"},  # v2's images come instead of texts
    "output_dimension": 64,
    "max_tokens": 512,
    "priority": 2,  # read and checked, then unused: every request has the same priority
    "chunking": {"size": 8, "overlap": 2, "boundary": "sentence", "late": True, "return": "mean"},
}
INPUTS = [{"content": [{"type": "text", "text": "x"}]}, {"content": [{"type": "text", "text": "y", "extra": 1}]}]
# a 1x1 PNG as a data URI
PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def _parse(doc: dict, version: int):
    return parse_embed(orjson.dumps(doc), LIMITS, version)


@pytest.mark.parametrize("path, model", [("/v1/embed", CohereEmbedV1Body), ("/v2/embed", CohereEmbedV2Body)])
def test_openapi_body_is_the_model_s_generated_schema(path, model):
    served = assert_served_is_generated(path, model)
    every = EVERY_V1 if model is CohereEmbedV1Body else {**EVERY_V2, "inputs": INPUTS, "images": [PNG]}
    assert set(served["properties"]) == set(every)
    assert served.get("required", []) == (["texts"] if model is CohereEmbedV1Body else [])


def test_a_field_added_to_the_model_is_in_the_schema(monkeypatch):
    class Wider(CohereEmbedV2Body):
        added: int = 0

    monkeypatch.setattr(openapi, "CohereEmbedV2Body", Wider)
    assert request_schema(served_spec(), "/v2/embed")["properties"]["added"]["type"] == "integer"


def test_every_field_of_the_schemas_is_read():
    r = _parse(EVERY_V2, version=2)
    assert (r.model, r.inputs.texts, r.input_type, r.types) == (
        "m",
        ["a long text", "another"],
        "document",
        ("int8", "float"),
    )
    assert (r.truncation, r.dimensions, r.max_tokens, r.task) == ("left", 64, 512, "retrieval.passage")
    assert r.options().task == "retrieval.passage"
    assert r.chunking == Chunking(ChunkSpec(8, 2, "sentence"), late=True, returns="mean")
    v1 = _parse(EVERY_V1, version=1)
    assert (v1.model, v1.inputs.texts, v1.input_type, v1.types, v1.truncation) == (
        "m",
        ["a long text", "another"],
        "document",
        ("int8", "float"),
        "left",
    )
    r = _parse({"inputs": INPUTS}, version=2)
    assert (r.inputs.texts, r.types) == (["x", "y"], ("float",))
    images = _parse({"images": [PNG, PNG], "input_type": "image"}, version=2)
    assert (images.inputs.texts, images.image_rows, images.input_type) == ([], (0, 1), None)
    assert images.images is not None and images.images.count == 2 and images.images.images[0][:4] == b"\x89PNG"
    assert [(s.format, s.width, s.height, s.bit_depth) for s in images.sizes] == [("PNG", 1, 1, 8)] * 2
    mixed = _parse({"inputs": [INPUTS[0], {"content": [{"type": "image_url", "image_url": {"url": PNG}}]}]}, version=2)
    assert (mixed.inputs.texts, mixed.image_rows) == (["x"], (1,))
    assert _parse({"texts": "a", "truncate": "none"}, version=1).truncation is None  # any letter case


def test_unknown_fields_are_ignored_and_v1_ignores_v2_s():
    r = _parse({"texts": "one", "stream": True, "extra": {"x": 1}}, version=2)
    assert r.inputs.texts == ["one"]
    v1 = _parse({**EVERY_V2, "inputs": "anything"}, version=1)
    assert (v1.dimensions, v1.max_tokens, v1.chunking) == (None, None, None)


def test_the_models_enums_are_the_gateway_s():
    assert get_args(InputType) == tuple(INPUT_TYPES)
    assert get_args(get_args(Truncate)[0]) == tuple(TRUNCATE)
    assert get_args(get_args(get_args(EmbeddingTypes)[0])[0]) == tuple(COHERE_TYPES)


def test_a_null_optional_field_is_as_if_absent():
    nulls = {k: None for k in {**EVERY_V2, "inputs": None} if k != "texts"}
    r = _parse({"texts": ["a"], **nulls}, version=2)
    assert (r.model, r.input_type, r.types, r.truncation, r.dimensions, r.max_tokens, r.chunking) == (
        None,
        None,
        ("float",),
        "right",
        None,
        None,
        None,
    )
    assert _parse({"texts": ["a"], **{k: None for k in EVERY_V1 if k != "texts"}}, version=1).types is None


INPUT_ITEM = (
    '{"content": [ITEM]}: one item, {"type": "text", "text": ...} or '
    '{"type": "image_url", "image_url": {"url": "data:image/..."}}'
)
TYPES = "'float', 'int8', 'uint8', 'binary', 'ubinary' or 'base64'"


@pytest.mark.parametrize(
    "version, doc, param, message",
    [
        (1, {}, "texts", "'texts' is required"),
        (1, {"texts": 5}, "texts", "'texts' must be a string or a list of strings, got 5"),
        (1, {"texts": []}, "texts", "'texts' must not be an empty list"),
        (1, {"texts": ["a", None]}, "texts", "'texts[1]' must be a string, got null"),
        (1, {"texts": ["a"], "model": 3}, "model", "'model' must be a string, got 3"),
        (1, {"texts": ["a"], "input_type": "photo"}, "input_type", "'input_type' must be one of 'search_query', 'search_document', 'classification', 'clustering' or 'image', got 'photo'"),
        (1, {"texts": ["a"], "truncate": "MIDDLE"}, "truncate", "'truncate' must be one of 'NONE', 'START' or 'END', got 'MIDDLE'"),
        (1, {"texts": ["a"], "embedding_types": ["float", 1]}, "embedding_types", f"'embedding_types[1]' must be one of {TYPES}, got 1"),
        (1, {"texts": ["a"], "images": ["data:image/png;base64,AA=="]}, "images", "'images' are served on /v2/embed (Cohere's v2 API), not here"),
        (1, {"texts": ["a"], "images": "x"}, "images", "'images' must be a list, got 'x'"),
        (2, {}, "texts", "'texts' is required (or 'inputs', or 'images')"),
        (2, {"texts": ["a"], "images": [PNG]}, "images", "send 'images' or texts ('texts', 'inputs'), not both"),
        (2, {"images": []}, "images", "'images' must not be an empty list"),
        (2, {"images": ["ftp://example.com/a.png"]}, "images", "'images[0]' must be a data URI (data:image/png;base64,...) or an https:// URL"),
        (2, {"texts": ["a"], "inputs": INPUTS}, "inputs", "send 'texts' or 'inputs', not both"),
        (2, {"inputs": {}}, "inputs", "'inputs' must be a list, got object"),
        (2, {"inputs": []}, "inputs", "'inputs' must not be an empty list"),
        (2, {"inputs": [*INPUTS, 5]}, "inputs", f"'inputs[2]' must be {INPUT_ITEM}"),
        (2, {"inputs": [{"content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "inputs", f"'inputs[0]' must be {INPUT_ITEM}"),
        (2, {"inputs": [{"content": [{"type": "text", "text": 5}]}]}, "inputs", f"'inputs[0]' must be {INPUT_ITEM}"),
        (2, {"inputs": [{"content": INPUTS[0]["content"] * 2}]}, "inputs", f"'inputs[0]' must be {INPUT_ITEM}"),
        (2, {"texts": ["a"], "output_dimension": 2**21}, "output_dimension", "'output_dimension' must be at most 1048576, got 2097152"),
        (2, {"texts": ["a"], "output_dimension": True}, "output_dimension", "'output_dimension' must be an integer, got true"),
        (2, {"texts": ["a"], "max_tokens": "8"}, "max_tokens", "'max_tokens' must be an integer, got '8'"),
        (2, {"texts": ["a"], "priority": 1.5}, "priority", "'priority' must be an integer, got 1.5"),
        (2, {"texts": ["a"], "chunking": {"size": 0}}, "chunking.size", "'chunking.size' must be at least 1, got 0"),
        (2, {"texts": ["a"], "chunking": {"size": 4, "overlap": 4}}, "chunking", "chunking.overlap (4) must be less than chunking.size (4)"),
    ],
)  # fmt: skip
def test_faults_name_their_field_in_cohere_s_shape(version, doc, param, message):
    with pytest.raises(ApiError) as err:
        _parse(doc, version)
    assert (err.value.code, err.value.param, err.value.message) == (ErrorCode.INVALID_REQUEST, param, message)
    answer = err.value.response(f"/v{version}/embed")
    assert answer.status_code == 400 and orjson.loads(answer.body) == {"message": message}


def test_limits_name_the_field_the_texts_came_in():
    with pytest.raises(ApiError) as err:
        _parse({"inputs": INPUTS * 3}, version=2)
    assert (err.value.param, err.value.message) == ("inputs", "'inputs' has 6 items; the limit is 4")
    assert err.value.response("/v2/embed").status_code == 422
    with pytest.raises(ApiError) as err:
        _parse({"texts": "x" * 51}, version=1)
    assert (err.value.param, err.value.message) == ("texts", "'texts[0]' has 51 characters; the limit is 50")
    assert err.value.response("/v1/embed").status_code == 400  # Cohere has no 413


ACCEPTED = [
    (1, EVERY_V1),
    (1, {"texts": "one"}),
    (2, EVERY_V2),
    (2, {"inputs": INPUTS, "embedding_types": ["base64"], "truncate": "NONE"}),
    (2, {"images": [PNG], "input_type": "image"}),
    (2, {"images": ["https://example.com/a.png"]}),  # fetched in the serving step, where --image-hosts allows
    (2, {"inputs": [{"content": [{"type": "image_url", "image_url": {"url": PNG}}]}]}),
]
REFUSED = [
    (1, {}),
    (1, {"texts": ["a"], "images": ["x"]}),
    (1, {"texts": ["a"], "embedding_types": []}),
    (2, {}),
    (2, {"texts": ["a"], "inputs": INPUTS}),
    (2, {"texts": ["a"], "images": [PNG]}),
    (2, {"images": ["ftp://example.com/a.png"]}),
    (2, {"inputs": [{"content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
    (2, {"inputs": [{"content": []}]}),
    (2, {"texts": ["a"], "output_dimension": 0}),
    (2, {"texts": ["a"], "chunking": {"size": 4, "stride": 2}}),
]


@pytest.mark.parametrize("version, doc", ACCEPTED + REFUSED)
def test_the_route_accepts_what_its_schema_accepts(version, doc):
    """The served schema and the route agree on each body: both accept it or both refuse it."""
    schema_ok, route_ok = verdicts(f"/v{version}/embed", lambda body: parse_embed(body, LIMITS, version), doc)
    assert schema_ok == route_ok == ((version, doc) in ACCEPTED)
