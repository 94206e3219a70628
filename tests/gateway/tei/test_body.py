"""TEI's embedding routes' typed bodies (/embed, /embed_sparse, /embed_all, /tokenize): /openapi.json's
request schemas are the models', every field of a schema is read, a body the schema accepts is accepted
and one it refuses is refused, and each fault answers in TEI's error shape naming the field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Limits
from embedfleet.services.gateway.openapi import openapi_spec
from embedfleet.services.gateway.tei.api import (
    parse_embed,
    parse_embed_all,
    parse_embed_sparse,
    parse_tokenize,
    read_embed_all,
)
from embedfleet.services.gateway.tei.body import EmbedAllBody, EmbedBody, EmbedSparseBody, TokenizeBody
from embedfleet.shared.errors import ErrorCode
from tests.gateway.typed_bodies import assert_schema_agrees, assert_tei_refusal, generated_schema, served_schema

LIMITS = Limits(max_inputs=10, max_input_chars=100)
MODELS = {"/embed": EmbedBody, "/embed_sparse": EmbedSparseBody, "/embed_all": EmbedAllBody, "/tokenize": TokenizeBody}

# every field of each body, none at its default: each must change what the route makes of the body
EVERY_FIELD: dict[str, dict[str, Any]] = {
    "/embed": {
        "inputs": ["a long text", "another"],
        "normalize": False,
        "truncate": True,
        "truncation_direction": "Left",
        "prompt_name": "query",
        "dimensions": 64,
        "embedding_type": "int8",
        "chunking": {"size": 8, "overlap": 2, "boundary": "sentence", "late": True, "return": "mean"},
        "model": "m",
    },
    "/embed_sparse": {
        "inputs": [[101, 7592, 102]],
        "truncate": True,
        "truncation_direction": "LEFT",
        "prompt_name": "doc",
        "top_k": 16,
        "threshold": 0.25,
        "model": "m",
    },
    "/embed_all": {
        "inputs": "a",
        "truncate": True,
        "truncation_direction": "left",
        "prompt_name": "doc",
        "output": "tokens",
        "input_type": "query",
        "embedding_type": "float16",
        "model": "m",
    },
    "/tokenize": {"inputs": ["hi", "there"], "add_special_tokens": False, "prompt_name": "query", "model": "m"},
}


def _parse(path: str, doc: dict[str, Any] | bytes) -> Any:
    body = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    if path == "/embed":
        return parse_embed(body, LIMITS)
    if path == "/embed_sparse":
        return parse_embed_sparse(body, LIMITS)
    if path == "/embed_all":
        return parse_embed_all(read_embed_all(body), LIMITS, ("dense", "multivector"))
    return parse_tokenize(body, LIMITS)


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return orjson.loads(orjson.dumps(openapi_spec("test")))  # as served: JSON


@pytest.mark.parametrize("path", list(MODELS))
def test_openapi_body_is_the_model_s_generated_schema(spec, path):
    served = served_schema(spec, path)
    assert served == generated_schema(MODELS[path])
    assert set(served["properties"]) == set(EVERY_FIELD[path]) and served["required"] == ["inputs"]


def test_a_field_added_to_the_model_appears_in_the_schema(spec):
    class Grown(EmbedBody):
        colour: str | None = None

    assert "colour" in Grown.model_json_schema()["properties"]
    assert "colour" not in served_schema(spec, "/embed")["properties"]  # the served one is EmbedBody's, nothing else


def test_every_field_of_the_schemas_is_read():
    embed = _parse("/embed", EVERY_FIELD["/embed"])
    o = embed.options
    assert (embed.inputs.texts, embed.model) == (["a long text", "another"], "m")
    assert (o.normalize, o.truncate, o.truncation_direction, o.prompt_name, o.dimensions, o.dtype) == (
        False,
        True,
        "left",
        "query",
        64,
        "i1",
    )
    assert embed.chunking is not None
    assert (embed.chunking.spec.size, embed.chunking.spec.overlap, embed.chunking.spec.boundary) == (8, 2, "sentence")
    assert (embed.chunking.late, embed.chunking.returns) == (True, "mean")
    sparse = _parse("/embed_sparse", EVERY_FIELD["/embed_sparse"])
    o = sparse.options
    assert [ids.tolist() for ids in sparse.inputs.token_ids] == [[101, 7592, 102]] and sparse.model == "m"
    assert (o.output, o.truncate, o.truncation_direction, o.prompt_name, o.sparse_top_k, o.sparse_threshold) == (
        "sparse",
        True,
        "left",
        "doc",
        16,
        0.25,
    )
    every = _parse("/embed_all", EVERY_FIELD["/embed_all"])
    o = every.options
    assert (every.inputs.texts, every.model) == (["a"], "m")
    assert (o.output, o.truncate, o.truncation_direction, o.prompt_name, o.input_type, o.dtype) == (
        "tokens",
        True,
        "left",
        "doc",
        "query",
        "f2",
    )
    tokenize = _parse("/tokenize", EVERY_FIELD["/tokenize"])
    assert (tokenize.texts, tokenize.add_special_tokens, tokenize.prompt_name, tokenize.model) == (
        ["hi", "there"],
        False,
        "query",
        "m",
    )


@pytest.mark.parametrize("path", list(MODELS))
def test_a_null_optional_field_is_as_if_absent_and_an_unknown_one_ignored(path):
    nulls = {k: None for k in EVERY_FIELD[path] if k != "inputs"}
    assert _parse(path, {"inputs": "a", **nulls}) == _parse(path, {"inputs": "a", "extra": {"x": [1]}})


def test_defaults_follow_tei():
    o = _parse("/embed", {"inputs": "a"}).options
    assert (o.normalize, o.truncate, o.truncation_direction, o.dtype) == (True, False, "right", "f4")
    assert _parse("/tokenize", {"inputs": "a"}).add_special_tokens is True
    assert parse_embed_all(read_embed_all(b'{"inputs": "a"}'), LIMITS, ("dense",)).options.output == "tokens"
    assert parse_embed_all(read_embed_all(b'{"inputs": "a"}'), LIMITS, ("multivector",)).options.output == "multivector"


# bodies the schema accepts: each route accepts them too
ACCEPTED = [
    ("/embed", {"inputs": [[1, 2], [3]], "truncation_direction": "Right"}),
    ("/embed", {"inputs": "a", "dimensions": 1, "chunking": {"size": 1}}),
    ("/embed_sparse", {"inputs": ["a", "b"], "threshold": 0, "top_k": 1}),
    ("/embed_all", {"inputs": [7], "output": "multivector", "embedding_type": "ubinary"}),
    ("/tokenize", {"inputs": "a", "prompt_name": "p" * 256}),
]
# bodies the schema refuses: each route refuses them, naming the field
REFUSED = [
    ("/embed", {"inputs": "a", "normalize": 1}, "normalize"),
    ("/embed", {"inputs": "a", "truncation_direction": "up"}, "truncation_direction"),
    ("/embed", {"inputs": "a", "dimensions": 0}, "dimensions"),
    ("/embed", {"inputs": "a", "chunking": {"size": 8, "x": 1}}, "chunking"),
    ("/embed", {"inputs": []}, "inputs"),
    ("/embed_sparse", {"inputs": "a", "threshold": "0.5"}, "threshold"),
    ("/embed_sparse", {"inputs": "a", "top_k": 0}, "top_k"),
    ("/embed_all", {"inputs": "a", "output": "all"}, "output"),
    ("/embed_all", {"inputs": "a", "input_type": "search_query"}, "input_type"),
    ("/tokenize", {"inputs": [101]}, "inputs"),
    ("/tokenize", {"inputs": "a", "prompt_name": "p" * 257}, "prompt_name"),
    ("/tokenize", {"inputs": "a", "add_special_tokens": "no"}, "add_special_tokens"),
]


@pytest.mark.parametrize("path, doc, param", [(path, doc, None) for path, doc in ACCEPTED] + REFUSED)
def test_the_route_accepts_what_its_schema_accepts_and_refuses_what_it_refuses(spec, path, doc, param):
    assert_schema_agrees(served_schema(spec, path), lambda: _parse(path, doc), doc, param)


@pytest.mark.parametrize(
    "path, doc, status, param, message",
    [
        ("/embed", {}, 400, "inputs", "'inputs' is required"),
        ("/embed", {"inputs": None}, 400, "inputs", "'inputs' must be a string, a list of strings, a list of token IDs or a list of token-ID lists, got null"),
        ("/embed", {"inputs": ["a", 3]}, 400, "inputs", "'inputs[1]' must be a string, got 3"),
        ("/embed", {"inputs": [1, -1]}, 422, "inputs", "'inputs' holds -1, not a token ID (an integer >= 0)"),
        ("/embed", {"inputs": [[1], [2, 2**31]]}, 422, "inputs", "'inputs[1]' holds 2147483648, not a token ID (an integer >= 0)"),
        ("/embed", {"inputs": [[1], []]}, 400, "inputs", "'inputs[1]' must be a non-empty list of token IDs"),
        ("/embed", {"inputs": "a", "truncation_direction": "up"}, 400, "truncation_direction", "'truncation_direction' must be 'Right' or 'Left', got 'up'"),
        ("/embed", {"inputs": "a", "truncate": "yes"}, 400, "truncate", "'truncate' must be true or false, got 'yes'"),
        ("/embed", {"inputs": "a", "dimensions": True}, 400, "dimensions", "'dimensions' must be an integer, got true"),
        ("/embed", {"inputs": "a", "model": 5}, 400, "model", "'model' must be a string, got 5"),
        ("/embed", {"inputs": "a", "prompt_name": "p" * 257}, 400, "prompt_name", "'prompt_name' has 257 characters; the limit is 256"),
        ("/embed", {"inputs": "a", "chunking": {"size": 0}}, 400, "chunking.size", "'chunking.size' must be at least 1, got 0"),
        ("/embed", {"inputs": [1, 2], "chunking": {"size": 4}}, 400, "chunking", "'chunking' cuts texts: give 'inputs' as text, not token IDs"),
        ("/embed", {"inputs": ["a"] * 11}, 422, "inputs", "'inputs' has 11 items; the limit is 10"),
        ("/embed", {"inputs": "x" * 101}, 413, "inputs", "'inputs[0]' has 101 characters; the limit is 100"),
        ("/embed_sparse", {"inputs": "a", "top_k": 2**40}, 400, "top_k", "'top_k' must be at most 1048576, got 1099511627776"),
        ("/embed_sparse", {"inputs": "a", "threshold": True}, 400, "threshold", "'threshold' must be a number, got true"),
        ("/embed_all", {"inputs": "a", "output": "all"}, 400, "output", "'output' must be 'tokens' or 'multivector', got 'all'"),
        ("/tokenize", {"inputs": 5}, 400, "inputs", "'inputs' must be a string or a list of strings, got 5"),
        ("/tokenize", {"inputs": [101]}, 400, "inputs", "'inputs[0]' must be a string, got 101"),
    ],
)  # fmt: skip
def test_faults_name_their_field_in_tei_shape(path, doc, status, param, message):
    assert_tei_refusal(lambda: _parse(path, doc), path, status, param, message)


@pytest.mark.parametrize("path", list(MODELS))
def test_a_body_that_is_no_json_object_is_refused(path):
    for body, message in [(b"[1]", "request body must be a JSON object"), (b"{", "request body is not valid JSON")]:
        with pytest.raises(ApiError) as err:
            _parse(path, body)
        assert err.value.code == ErrorCode.INVALID_REQUEST and err.value.message.startswith(message)


def test_a_threshold_past_a_double_is_refused():
    with pytest.raises(ApiError) as err:
        _parse("/embed_sparse", b'{"inputs": "a", "threshold": 1e400}')
    assert (err.value.param, err.value.message) == ("threshold", "'threshold' must be a finite number, got inf")
