"""The typed bodies of /v1/rerank (Cohere v1 and Jina; OpenAI's errors) and /v2/rerank (Cohere v2;
Cohere's errors): /openapi.json's request schemas are the models', they name exactly the fields the
routes read, what a schema accepts the route accepts; faults answer in the route's error shape, naming
the field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from embedfleet.services.gateway import openapi
from embedfleet.services.gateway.cohere.api import parse_rerank
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Limits
from embedfleet.services.gateway.rerank.api import RerankCall, parse_cohere
from embedfleet.services.gateway.rerank.body import CohereRerankV1Body, CohereRerankV2Body
from embedfleet.shared.errors import ErrorCode
from tests.gateway.typed_bodies import assert_served_is_generated, request_schema, served_spec, verdicts

LIMITS = Limits(max_inputs=3, max_input_chars=20)

# every field, none at its default: each changes what the route makes of the body
EVERY_V1: dict[str, Any] = {
    "model": "m",
    "query": "q",
    "documents": ["a", {"text": "b", "title": "ignored"}],
    "top_n": 1,
    "return_documents": True,
    "truncate": False,
}
EVERY_V2: dict[str, Any] = {
    "model": "m",
    "query": "q",
    "documents": ["a", "b"],
    "top_n": 1,
    "max_tokens_per_doc": 4096,
    "priority": 1,  # read and checked, then unused: every request has the same priority
    "relevant_spans": None,  # read and checked: refused unless empty
}
PARSE = {"/v1/rerank": parse_cohere, "/v2/rerank": lambda body, limits: parse_rerank(body, limits).call}


def _parse(path: str, doc: dict) -> RerankCall:
    return PARSE[path](orjson.dumps(doc), LIMITS)


@pytest.mark.parametrize(
    "path, model, every",
    [("/v1/rerank", CohereRerankV1Body, EVERY_V1), ("/v2/rerank", CohereRerankV2Body, EVERY_V2)],
)
def test_openapi_body_is_the_model_s_generated_schema(path, model, every):
    served = assert_served_is_generated(path, model)
    assert set(served["properties"]) == set(every)
    assert served["required"] == ["query", "documents"]


def test_a_field_added_to_the_model_is_in_the_schema(monkeypatch):
    class Wider(CohereRerankV1Body):
        added: bool = False

    monkeypatch.setattr(openapi, "CohereRerankV1Body", Wider)
    assert request_schema(served_spec(), "/v1/rerank")["properties"]["added"]["type"] == "boolean"


def test_every_field_of_the_schemas_is_read():
    assert _parse("/v1/rerank", EVERY_V1) == RerankCall("m", "q", ["a", "b"], 1, False, False, True)
    r = parse_rerank(orjson.dumps(EVERY_V2), LIMITS)
    assert (r.call, r.max_tokens_per_doc) == (RerankCall("m", "q", ["a", "b"], 1, False, True, False), 4096)


@pytest.mark.parametrize("path, every", [("/v1/rerank", EVERY_V1), ("/v2/rerank", EVERY_V2)])
def test_null_optional_fields_are_as_if_absent_and_unknown_ones_ignored(path, every):
    nulls = {k: None for k in every if k not in ("query", "documents")}
    call = _parse(path, {"query": "q", "documents": [], "stream": True, **nulls})
    # documents over the model's limit are cut unless /v1/rerank's truncate says not; an empty list ranks nothing
    assert call == RerankCall(None, "q", [], None, False, True, False)


@pytest.mark.parametrize(
    "path, doc, param, message",
    [
        (path, doc, param, message)
        for path in ("/v1/rerank", "/v2/rerank")
        for doc, param, message in [
            ({"documents": ["a"]}, "query", "'query' is required"),
            ({"query": "", "documents": ["a"]}, "query", "'query' must not be an empty string"),
            ({"query": ["q"], "documents": ["a"]}, "query", "'query' must be a string, got array"),
            ({"query": "q"}, "documents", "'documents' is required"),
            ({"query": "q", "documents": "a"}, "documents", "'documents' must be a list, got 'a'"),
            ({"query": "q", "documents": ["a"], "model": 1}, "model", "'model' must be a string, got 1"),
            ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n", "'top_n' must be at least 1, got 0"),
            ({"query": "q", "documents": ["a"], "top_n": 1.0}, "top_n", "'top_n' must be an integer, got 1.0"),
        ]
    ]
    + [
        ("/v1/rerank", {"query": "q", "documents": ["a", 5]}, "documents", "'documents[1]' must be a string or an object with 'text', got 5"),
        ("/v1/rerank", {"query": "q", "documents": [{"title": "a"}]}, "documents.text", "'documents[0].text' is required"),
        ("/v1/rerank", {"query": "q", "documents": [{"text": None}]}, "documents.text", "'documents[0].text' must be a string, got null"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "return_documents": 1}, "return_documents", "'return_documents' must be true or false, got 1"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "truncate": "yes"}, "truncate", "'truncate' must be true or false, got 'yes'"),
        ("/v2/rerank", {"query": "q", "documents": [{"text": "a"}]}, "documents", "'documents[0]' must be a string, got object"),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "max_tokens_per_doc": 0}, "max_tokens_per_doc", "'max_tokens_per_doc' must be at least 1, got 0"),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "priority": "high"}, "priority", "'priority' must be an integer, got 'high'"),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "relevant_spans": {"mode": "on"}}, "relevant_spans", "'relevant_spans' is not supported"),
    ],
)  # fmt: skip
def test_faults_name_their_field_in_the_route_s_shape(path, doc, param, message):
    with pytest.raises(ApiError) as err:
        _parse(path, doc)
    assert (err.value.code, err.value.param, err.value.message) == (ErrorCode.INVALID_REQUEST, param, message)
    answer = err.value.response(path)
    assert answer.status_code == 400
    if path == "/v2/rerank":  # Cohere's shape
        assert orjson.loads(answer.body) == {"message": message}
    else:  # OpenAI's
        error = {"message": message, "type": "invalid_request_error", "param": param, "code": "invalid_request"}
        assert orjson.loads(answer.body) == {"error": error}


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_limits_keep_their_status(path):
    with pytest.raises(ApiError) as err:
        _parse(path, {"query": "q" * 21, "documents": ["a"]})
    assert (err.value.code, err.value.param) == (ErrorCode.INPUT_TOO_LONG, "query")
    assert err.value.message == "'query' has 21 characters; the limit is 20"
    with pytest.raises(ApiError) as err:
        _parse(path, {"query": "q", "documents": ["a", "b" * 21]})
    assert (err.value.code, err.value.message) == (
        ErrorCode.INPUT_TOO_LONG,
        "'documents[1]' has 21 characters; the limit is 20",
    )
    with pytest.raises(ApiError) as err:
        _parse(path, {"query": "q", "documents": ["a"] * 4})
    assert (err.value.code, err.value.message) == (ErrorCode.TOO_MANY_INPUTS, "'documents' has 4 items; the limit is 3")
    # OpenAI's 413; Cohere has none and answers 400
    assert err.value.response(path).status_code == 422
    assert ApiError(ErrorCode.INPUT_TOO_LONG, "x").response(path).status_code == (413 if path == "/v1/rerank" else 400)


ACCEPTED = [
    ("/v1/rerank", EVERY_V1),
    ("/v1/rerank", {"query": "q", "documents": []}),
    ("/v2/rerank", EVERY_V2),
    ("/v2/rerank", {"query": "q", "documents": ["a"], "top_n": 2**40}),
]
REFUSED = [
    ("/v1/rerank", {"query": "q", "documents": [{"title": "a"}]}),
    ("/v1/rerank", {"query": "", "documents": ["a"]}),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}),
    ("/v2/rerank", {"query": "q", "documents": [{"text": "a"}]}),
    ("/v2/rerank", {"query": "q", "documents": ["a"], "max_tokens_per_doc": -1}),
    ("/v2/rerank", {"documents": ["a"]}),
]


@pytest.mark.parametrize("path, doc", ACCEPTED + REFUSED)
def test_the_route_accepts_what_its_schema_accepts(path, doc):
    """The served schema and the route agree on each body: both accept it or both refuse it."""
    schema_ok, route_ok = verdicts(path, lambda body: PARSE[path](body, LIMITS), doc)
    assert schema_ok == route_ok == ((path, doc) in ACCEPTED)
