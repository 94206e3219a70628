"""TEI's task routes' typed bodies (/predict, /similarity, /decode, /rerank, and POST / which takes each):
/openapi.json's request schemas are the models', every field is read, a body the schema accepts is
accepted and one it refuses is refused, and each fault answers in TEI's error shape naming the field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from embedfleet.services.gateway.inputs import Limits
from embedfleet.services.gateway.openapi import openapi_spec
from embedfleet.services.gateway.tei.task_bodies import DecodeBody, PredictBody, RerankBody, SimilarityBody
from embedfleet.services.gateway.tei.tasks import parse_decode, parse_predict, parse_rerank, parse_similarity
from tests.gateway.typed_bodies import assert_schema_agrees, assert_tei_refusal, generated_schema, served_schema

LIMITS = Limits(max_inputs=4, max_input_chars=50)
MODELS = {"/predict": PredictBody, "/similarity": SimilarityBody, "/decode": DecodeBody, "/rerank": RerankBody}
PARSERS = {"/predict": parse_predict, "/similarity": parse_similarity, "/decode": parse_decode, "/rerank": parse_rerank}

EVERY_FIELD: dict[str, dict[str, Any]] = {
    "/predict": {
        "inputs": [["q", "d"], ["x"]],
        "raw_scores": True,
        "truncate": True,
        "truncation_direction": "Left",
        "model": "m",
    },
    "/similarity": {
        "inputs": {"source_sentence": "s", "sentences": ["a", "b"]},
        "parameters": {"truncate": True, "truncation_direction": "Left", "prompt_name": "query"},
        "model": "m",
    },
    "/decode": {"ids": [[101], [7592, 2088]], "skip_special_tokens": False, "model": "m"},
    "/rerank": {
        "query": "q",
        "texts": ["a", "b"],
        "raw_scores": True,
        "return_text": True,
        "truncate": True,
        "top_n": 1,
        "model": "m",
    },
}
REQUIRED = {"/predict": ["inputs"], "/similarity": ["inputs"], "/decode": ["ids"], "/rerank": ["query", "texts"]}


def _parse(path: str, doc: dict[str, Any]) -> Any:
    return PARSERS[path](orjson.dumps(doc), LIMITS)


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return orjson.loads(orjson.dumps(openapi_spec("test")))


@pytest.mark.parametrize("path", list(MODELS))
def test_openapi_body_is_the_model_s_generated_schema(spec, path):
    want = generated_schema(MODELS[path])
    assert served_schema(spec, path) == want
    assert set(want["properties"]) == set(EVERY_FIELD[path]) and want["required"] == REQUIRED[path]


@pytest.mark.parametrize("path", ["/", "/invocations"])
def test_root_takes_each_task_s_typed_body(spec, path):
    root = served_schema(spec, path)
    for task in ("/embed", "/embed_sparse", "/rerank", "/predict", "/similarity"):
        assert served_schema(spec, task) in root["oneOf"]
    for task in ("/rerank", "/predict", "/similarity", "/embed"):
        assert set(EVERY_FIELD.get(task, {})) <= set(root["properties"])


def test_every_field_is_read():
    p = _parse("/predict", EVERY_FIELD["/predict"])
    assert (p.inputs, p.batch, p.raw_scores, p.truncate, p.truncation_direction, p.model) == (
        [("q", "d"), "x"],
        True,
        True,
        True,
        "left",
        "m",
    )
    s = _parse("/similarity", EVERY_FIELD["/similarity"])
    assert (s.inputs.texts, s.model) == (["s", "a", "b"], "m")
    assert (s.options.truncate, s.options.truncation_direction, s.options.prompt_name) == (True, "left", "query")
    d = _parse("/decode", EVERY_FIELD["/decode"])
    assert ([ids.tolist() for ids in d.ids], d.skip_special_tokens, d.model) == ([[101], [7592, 2088]], False, "m")
    r = _parse("/rerank", EVERY_FIELD["/rerank"])
    assert (r.query, r.texts, r.raw_scores, r.return_text, r.truncate, r.top_n, r.model) == (
        "q",
        ["a", "b"],
        True,
        True,
        True,
        1,
        "m",
    )


@pytest.mark.parametrize("path", list(MODELS))
def test_a_null_optional_field_is_as_if_absent_and_an_unknown_one_ignored(path):
    base = {k: EVERY_FIELD[path][k] for k in REQUIRED[path]}
    nulls = {k: None for k in EVERY_FIELD[path] if k not in REQUIRED[path]}
    # compared by repr: a call may hold numpy arrays (decode's ids)
    assert repr(_parse(path, {**base, **nulls})) == repr(_parse(path, {**base, "extra": [1]}))


def test_defaults_follow_tei():
    p = _parse("/predict", {"inputs": "a"})
    assert (p.raw_scores, p.truncate, p.truncation_direction) == (False, False, "right")
    assert _parse("/decode", {"ids": [1]}).skip_special_tokens is True
    r = _parse("/rerank", {"query": "q", "texts": []})
    assert (r.texts, r.raw_scores, r.return_text, r.truncate, r.top_n) == ([], False, False, False, None)


ACCEPTED = [
    ("/predict", {"inputs": ["only text"]}),
    ("/predict", {"inputs": [["a"], ["b", "c"]], "truncation_direction": "right"}),
    ("/similarity", {"inputs": {"source_sentence": "", "sentences": [""]}, "parameters": {}}),
    ("/decode", {"ids": [0, 2**31 - 1]}),
    ("/rerank", {"query": "q", "texts": [], "top_n": 1}),
]
REFUSED = [
    ("/predict", {"inputs": ["a", "b", "c"]}, "inputs"),
    ("/predict", {"inputs": "a", "raw_scores": 1}, "raw_scores"),
    ("/similarity", {"inputs": {"source_sentence": "s", "sentences": []}}, "inputs.sentences"),
    ("/similarity", {"inputs": {"source_sentence": "s", "sentences": ["a"]}, "parameters": 3}, "parameters"),
    ("/decode", {"ids": [[1], []]}, "ids"),
    ("/decode", {"ids": [1], "skip_special_tokens": "no"}, "skip_special_tokens"),
    ("/rerank", {"query": "", "texts": ["a"]}, "query"),
    ("/rerank", {"query": "q", "texts": ["a"], "top_n": 0}, "top_n"),
]


@pytest.mark.parametrize("path, doc, param", [(path, doc, None) for path, doc in ACCEPTED] + REFUSED)
def test_the_route_accepts_what_its_schema_accepts_and_refuses_what_it_refuses(spec, path, doc, param):
    assert_schema_agrees(served_schema(spec, path), lambda: _parse(path, doc), doc, param)


@pytest.mark.parametrize(
    "path, doc, status, param, message",
    [
        ("/predict", {}, 400, "inputs", "'inputs' is required"),
        ("/predict", {"inputs": [["a"], "b"]}, 400, "inputs", "'inputs[1]' must be a string, a pair of strings [text, text_pair] or a batch of [text] and [text, text_pair] lists"),
        ("/predict", {"inputs": ["a", 7]}, 400, "inputs", "'inputs' must be a string, a pair of strings [text, text_pair] or a batch of [text] and [text, text_pair] lists"),
        ("/predict", {"inputs": "a", "truncation_direction": "up"}, 400, "truncation_direction", "'truncation_direction' must be 'Right' or 'Left', got 'up'"),
        ("/predict", {"inputs": [["a"]] * 5}, 422, "inputs", "'inputs' has 5 items; the limit is 4"),
        ("/predict", {"inputs": ["q", "x" * 51]}, 413, "inputs", "'inputs' has a text of 51 characters; the limit is 50"),
        ("/similarity", {"inputs": "s"}, 400, "inputs", "'inputs' must be an object, got 's'"),
        ("/similarity", {"inputs": {"source_sentence": 3, "sentences": ["a"]}}, 400, "inputs.source_sentence", "'inputs.source_sentence' must be a string, got 3"),
        ("/similarity", {"inputs": {"source_sentence": "s", "sentences": [1]}}, 400, "inputs.sentences", "'inputs.sentences[0]' must be a string, got 1"),
        ("/similarity", {"inputs": {"source_sentence": "s", "sentences": ["a"]}, "parameters": {"prompt_name": 1}}, 400, "parameters.prompt_name", "'parameters.prompt_name' must be a string, got 1"),
        ("/similarity", {"inputs": {"source_sentence": "s", "sentences": ["a"] * 4}}, 422, "inputs", "'inputs.sentences' has 4 items, 5 inputs with the source sentence; the limit is 4"),
        ("/similarity", {"inputs": {"source_sentence": "x" * 51, "sentences": ["a"]}}, 413, "inputs.source_sentence", "'inputs.source_sentence[0]' has 51 characters; the limit is 50"),
        ("/decode", {}, 400, "ids", "'ids' is required"),
        ("/decode", {"ids": "101"}, 400, "ids", "'ids' must be a list of token IDs or a list of token-ID lists, got string"),
        ("/decode", {"ids": ["hello"]}, 400, "ids", "'ids' must be a list of token IDs or a list of token-ID lists, got a list of strings"),
        ("/decode", {"ids": [True]}, 400, "ids", "'ids' must be a list of token IDs or a list of token-ID lists, got a list of booleans"),
        ("/decode", {"ids": [1.5]}, 400, "ids", "'ids' must be a list of token IDs or a list of token-ID lists, got a list of numbers"),
        ("/decode", {"ids": []}, 400, "ids", "'ids' must not be an empty list"),
        ("/decode", {"ids": [101, -1]}, 422, "ids", "'ids' holds -1, not a token ID (an integer >= 0)"),
        ("/decode", {"ids": [[101], [2**31]]}, 422, "ids", "'ids[1]' holds 2147483648, not a token ID (an integer >= 0)"),
        ("/decode", {"ids": [[101], 7]}, 400, "ids", "'ids[1]' must be a non-empty list of token IDs"),
        ("/decode", {"ids": [[1]] * 5}, 422, "ids", "'ids' has 5 items; the limit is 4"),
        ("/rerank", {"texts": ["a"]}, 400, "query", "'query' is required"),
        ("/rerank", {"query": 5, "texts": ["a"]}, 400, "query", "'query' must be a string, got 5"),
        ("/rerank", {"query": "q"}, 400, "texts", "'texts' is required"),
        ("/rerank", {"query": "q", "texts": "a"}, 400, "texts", "'texts' must be a list, got 'a'"),
        ("/rerank", {"query": "q", "texts": ["a", None]}, 400, "texts", "'texts[1]' must be a string, got null"),
        ("/rerank", {"query": "q", "texts": ["a"], "return_text": "yes"}, 400, "return_text", "'return_text' must be true or false, got 'yes'"),
        ("/rerank", {"query": "x" * 51, "texts": ["a"]}, 413, "query", "'query' has 51 characters; the limit is 50"),
        ("/rerank", {"query": "q", "texts": ["x" * 51]}, 413, "texts", "'texts[0]' has 51 characters; the limit is 50"),
        ("/rerank", {"query": "q", "texts": ["a"] * 5}, 422, "texts", "'texts' has 5 items; the limit is 4"),
    ],
)  # fmt: skip
def test_faults_name_their_field_in_tei_shape(path, doc, status, param, message):
    assert_tei_refusal(lambda: _parse(path, doc), path, status, param, message)


@pytest.mark.parametrize("path", list(MODELS))
@pytest.mark.parametrize(
    "body, message",
    [
        (b"", "request body is not valid JSON: EOF while parsing a value at line 1 column 0"),
        (b"{", "request body is not valid JSON: EOF while parsing an object at line 1 column 1"),
        (b"[1]", "request body must be a JSON object"),
        (b"null", "request body must be a JSON object"),
    ],
)
def test_a_body_that_is_no_json_object_is_refused(path, body, message):
    assert_tei_refusal(lambda: PARSERS[path](body, LIMITS), path, 400, None, message)
