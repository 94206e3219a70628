"""/v1/embeddings' typed body: /openapi.json's request schema is the model's, and it names exactly the
fields the route reads; its faults answer in OpenAI's error shape, naming the field."""

from __future__ import annotations

from typing import Any, get_args

import orjson
import pytest

from embedfleet.services.gateway.chunking import RETURNS
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Limits
from embedfleet.services.gateway.openai.api import parse_embeddings_request
from embedfleet.services.gateway.openai.body import ChunkingBody, EmbeddingsBody
from embedfleet.services.gateway.openapi import openapi_spec
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.text_chunks import BOUNDARIES
from embedfleet.shared.vectors.forms import EMBEDDING_TYPES
from tests.gateway.typed_bodies import resolved

LIMITS = Limits(max_inputs=10, max_input_chars=100)

# every field, none at its default: each must change what the route makes of the body ('user' is read
# and checked, then unused, as OpenAI's abuse-tracking id means nothing here)
EVERY_FIELD: dict[str, Any] = {
    "model": "m",
    "input": ["a long text", "another"],
    "encoding_format": "base64",
    "dimensions": 64,
    "user": "u-1",
    "input_type": "document",
    "task": "retrieval.passage",
    "embedding_type": "int8",
    "chunking": {"size": 8, "overlap": 2, "boundary": "sentence", "late": True, "return": "mean"},
    "modality": "text",
}


@pytest.mark.parametrize("path", ["/v1/embeddings", "/embeddings"])
def test_openapi_body_is_the_model_s_generated_schema(path):
    spec = orjson.loads(orjson.dumps(openapi_spec("test")))  # as served: JSON
    served = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    generated = EmbeddingsBody.model_json_schema()
    defs = generated.pop("$defs")
    assert resolved(served, spec["components"]["schemas"]) == resolved(
        orjson.loads(orjson.dumps(generated).replace(b"#/$defs/", b"#/components/schemas/")), defs
    )
    assert set(served["properties"]) == set(EVERY_FIELD)
    assert served["required"] == ["model", "input"]
    chunking = spec["components"]["schemas"]["ChunkingBody"]
    assert (
        set(chunking["properties"]) == {"size", "overlap", "boundary", "late", "return"}
        and chunking["additionalProperties"] is False
    )


def test_every_field_of_the_schema_is_read():
    r = parse_embeddings_request(orjson.dumps(EVERY_FIELD), LIMITS)
    assert (r.model, r.texts, r.encoding_format, r.dimensions) == ("m", ["a long text", "another"], "base64", 64)
    assert (r.input_type, r.embedding_type, r.task) == ("document", "int8", "retrieval.passage")
    assert r.chunking is not None
    assert (r.chunking.spec.size, r.chunking.spec.overlap, r.chunking.spec.boundary) == (8, 2, "sentence")
    assert (r.chunking.late, r.chunking.returns) == (True, "mean")


def test_unknown_fields_are_ignored_and_unknown_chunking_keys_refused():
    r = parse_embeddings_request(orjson.dumps({"model": "m", "input": "a", "extra": {"x": 1}}), LIMITS)
    assert r.texts == ["a"]
    with pytest.raises(ApiError) as err:
        parse_embeddings_request(orjson.dumps({"model": "m", "input": "a", "chunking": {"size": 4, "x": 1}}), LIMITS)
    assert (err.value.status, err.value.param, err.value.message) == (
        400,
        "chunking",
        "'chunking' has unknown keys 'x'",
    )


def test_the_model_s_enums_are_the_gateway_s():
    fields = EmbeddingsBody.model_fields
    assert set(get_args(get_args(fields["embedding_type"].annotation)[0])) == set(EMBEDDING_TYPES)
    assert get_args(ChunkingBody.model_fields["boundary"].annotation) == BOUNDARIES
    assert get_args(ChunkingBody.model_fields["returns"].annotation) == RETURNS


@pytest.mark.parametrize(
    "doc, param, message",
    [
        ({"model": "m", "input": "a", "chunking": {"size": "8"}}, "chunking.size", "'chunking.size' must be an integer, got '8'"),
        ({"model": "m", "input": "a", "chunking": {"size": 0}}, "chunking.size", "'chunking.size' must be at least 1, got 0"),
        ({"model": "m", "input": "a", "chunking": {}}, "chunking.size", "'chunking.size' is required"),
        ({"model": "m", "input": "a", "chunking": {"size": 8, "late": 1}}, "chunking.late", "'chunking.late' must be true or false, got 1"),
        ({"model": "m", "input": "a", "chunking": {"size": 8, "return": "all"}}, "chunking.return", "'chunking.return' must be 'chunks' or 'mean', got 'all'"),
        ({"model": "m", "input": "a", "chunking": {"size": 4, "b": 1, "a": 2}}, "chunking", "'chunking' has unknown keys 'b', 'a'"),
        ({"model": "m", "input": "a", "chunking": "yes"}, "chunking", "'chunking' must be an object, got 'yes'"),
        ({"model": "m", "input": "a", "chunking": {"size": 4, "overlap": 4}}, "chunking", "chunking.overlap (4) must be less than chunking.size (4)"),
        ({"model": "m", "input": [1, 2], "chunking": {"size": 4}}, "chunking", "'chunking' cuts texts: give 'input' as text, not token IDs"),
        ({"model": "", "input": "a"}, "model", "'model' must not be an empty string"),
        ({"model": 5, "input": "a"}, "model", "'model' must be a string, got 5"),
        ({"model": "m", "input": 5}, "input", "'input' must be a string, a list of strings, a list of token IDs, a list of token-ID lists or a list of {'text': ...} / {'image': ...} items, got 5"),
        ({"model": "m", "input": "a", "dimensions": 2**21}, "dimensions", "'dimensions' must be at most 1048576, got 2097152"),
        ({"model": "m", "input": "a", "dimensions": 8.0}, "dimensions", "'dimensions' must be an integer, got 8.0"),
    ],
)  # fmt: skip
def test_faults_name_their_field(doc, param, message):
    with pytest.raises(ApiError) as err:
        parse_embeddings_request(orjson.dumps(doc), LIMITS)
    assert (err.value.code, err.value.param, err.value.message) == (ErrorCode.INVALID_REQUEST, param, message)
    error = orjson.loads(err.value.response("/v1/embeddings").body)["error"]
    assert error == {"message": message, "type": "invalid_request_error", "param": param, "code": "invalid_request"}


def test_a_null_optional_field_is_as_if_absent():
    nulls = {k: None for k in EVERY_FIELD if k not in ("model", "input")}
    r = parse_embeddings_request(orjson.dumps({"model": "m", "input": "a", **nulls}), LIMITS)
    assert (r.encoding_format, r.dimensions, r.input_type, r.embedding_type, r.chunking) == (
        "float",
        None,
        None,
        "float32",
        None,
    )
