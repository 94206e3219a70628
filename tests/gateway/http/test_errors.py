"""The one error table: every code has its row, and each API answers each code in its own shape."""

from __future__ import annotations

import orjson
import pytest
from starlette.testclient import TestClient

from embedfleet.services.gateway.app import create_app
from embedfleet.services.gateway.config import GatewayConfig
from embedfleet.services.gateway.http.errors import TABLE, ApiError, error_response
from embedfleet.shared.errors import TRUNCATE_HINT, ErrorCode, ServiceError
from embedfleet.shared.nats.config import NatsConfig
from embedfleet.shared.nats.subjects import Subjects

OPENAI, TEI, COHERE = "/v1/embeddings", "/embed", "/v2/embed"

# what clients are answered, code by code: (status, OpenAI type, TEI type, Cohere status, OpenAI code)
ANSWERED = {
    ErrorCode.INVALID_REQUEST: (400, "invalid_request_error", "Validation", 400, "invalid_request"),
    ErrorCode.INPUT_TOO_LONG: (413, "invalid_request_error", "Validation", 400, "input_too_long"),
    ErrorCode.PAYLOAD_TOO_LARGE: (413, "invalid_request_error", "Validation", 400, "invalid_request"),
    ErrorCode.TOO_MANY_INPUTS: (422, "invalid_request_error", "Validation", 422, "invalid_request"),
    ErrorCode.INVALID_TOKENS: (422, "invalid_request_error", "Validation", 422, "invalid_tokens"),
    ErrorCode.MODEL_NOT_FOUND: (404, "invalid_request_error", "Validation", 404, "model_not_found"),
    ErrorCode.NOT_FOUND: (404, "invalid_request_error", "Validation", 404, "not_found"),
    ErrorCode.ROUTE_NOT_FOUND: (404, "invalid_request_error", "Validation", 404, None),
    ErrorCode.METHOD_NOT_ALLOWED: (405, "invalid_request_error", "Validation", 405, None),
    ErrorCode.NOT_ACCEPTABLE: (406, "invalid_request_error", "Validation", 406, "not_acceptable"),
    ErrorCode.NOT_FINISHED: (409, "invalid_request_error", "Validation", 409, "not_finished"),
    ErrorCode.GONE: (410, "invalid_request_error", "Validation", 410, "gone"),
    ErrorCode.CONFLICT: (409, "invalid_request_error", "Validation", 409, "conflict"),
    ErrorCode.UNSUPPORTED_MEDIA: (415, "invalid_request_error", "Validation", 415, "unsupported_media_type"),
    ErrorCode.UNAUTHORIZED: (401, "authentication_error", "Unauthorized", 401, "unauthorized"),
    ErrorCode.FORBIDDEN: (403, "permission_error", "Unauthorized", 403, "forbidden"),
    ErrorCode.OVERLOADED: (429, "rate_limit_error", "Overloaded", 429, "overloaded"),
    ErrorCode.INTERNAL: (500, "server_error", "Backend", 500, "internal"),
    ErrorCode.NO_RESPONDERS: (503, "service_unavailable", "Unhealthy", 503, "no_responders"),
    ErrorCode.TIMEOUT: (504, "timeout_error", "Backend", 504, "timeout"),
}


def test_every_code_has_one_row():
    assert set(TABLE) == set(ErrorCode) == set(ANSWERED)


@pytest.mark.parametrize("code", list(ErrorCode))
def test_each_api_answers_each_code_in_its_shape(code):
    status, openai_type, tei_type, cohere_status, openai_code = ANSWERED[code]
    error = ApiError(code, "went wrong", "input")
    assert error.status == status
    openai = error.response(OPENAI)
    assert openai.status_code == status
    assert orjson.loads(openai.body) == {
        "error": {"message": "went wrong", "type": openai_type, "param": "input", "code": openai_code}
    }
    tei = error.response(TEI)
    assert tei.status_code == status and orjson.loads(tei.body) == {"error": "went wrong", "error_type": tei_type}
    cohere = error.response(COHERE)
    assert cohere.status_code == cohere_status and orjson.loads(cohere.body) == {"message": "went wrong"}
    assert error_response(OPENAI, code, "went wrong", "input").body == openai.body


def test_cohere_differs_only_where_it_has_no_413_and_openai_codes_only_for_limits_and_routing():
    assert {c for c, a in TABLE.items() if a.cohere_status != a.status} == {
        ErrorCode.INPUT_TOO_LONG,
        ErrorCode.PAYLOAD_TOO_LARGE,
    }
    broader = {c for c, a in TABLE.items() if a.openai_code != c.value}
    assert broader == {
        ErrorCode.PAYLOAD_TOO_LARGE,
        ErrorCode.TOO_MANY_INPUTS,
        ErrorCode.ROUTE_NOT_FOUND,
        ErrorCode.METHOD_NOT_ALLOWED,
    }


def test_a_service_error_of_an_input_names_its_row():
    error = ApiError.of(ServiceError(ErrorCode.INPUT_TOO_LONG, "has 300 tokens; the model's limit is 256", 3))
    assert (error.code, error.status, error.param) == (ErrorCode.INPUT_TOO_LONG, 413, None)
    assert error.message == "input 3 has 300 tokens; the model's limit is 256"
    assert ApiError.of(ServiceError(ErrorCode.TIMEOUT, "late")).message == "late"


@pytest.mark.parametrize(
    "path, hint",
    [
        ("/embed", "(send truncate=true to cut it)"),
        ("/rerank", "(send truncate=true to cut it)"),
        ("/v1/embed", '(send truncate "END" or "START" to cut it)'),
        ("/v2/embed", '(send truncate "END" or "START" to cut it)'),
        ("/v1/rerank", '(send "truncate": true to cut it)'),
    ],
)
def test_an_input_over_the_models_limit_says_how_to_cut_it_in_the_routes_words(path, hint):
    said = ApiError.of(
        ServiceError(ErrorCode.INPUT_TOO_LONG, f"has 300 tokens; the model's limit is 256 {TRUNCATE_HINT}", 1)
    )
    body = orjson.loads(said.response(path).body)
    message = body["message"] if "message" in body else body["error"]
    message = message["message"] if isinstance(message, dict) else message  # OpenAI's shape nests it
    assert message == f"input 1 has 300 tokens; the model's limit is 256 {hint}"
    # another refusal of length (characters, chunks) keeps its own words
    other = orjson.loads(error_response(path, ErrorCode.INPUT_TOO_LONG, "'texts[0]' has 70000 characters").body)
    assert "truncate" not in orjson.dumps(other).decode()


@pytest.fixture(scope="module")
def app_client():
    """The gateway's app without its lifespan (no NATS): what it answers before any service is asked."""
    cfg = GatewayConfig(
        NatsConfig("nats://127.0.0.1:4222", Subjects()), "127.0.0.1", 8080, 30.0, max_inputs=16, max_body_bytes=1000
    )
    return TestClient(create_app(cfg), base_url="http://localhost")  # a Host the gateway is served as


def test_routing_and_body_limits_answer_from_the_table(app_client):
    missing = app_client.get("/no-such-route")
    assert missing.status_code == 404
    assert missing.json() == {
        "error": {"message": "Not Found", "type": "invalid_request_error", "param": None, "code": None}
    }
    wrong = app_client.get("/embed")
    assert wrong.status_code == 405 and wrong.json() == {"error": "Method Not Allowed", "error_type": "Validation"}
    big = {"model": "m", "input": "x" * 2000}
    over = app_client.post(OPENAI, json=big)
    assert over.status_code == 413 and over.json() == {
        "error": {
            "message": "request body is over the 1000 byte limit",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_request",
        }
    }
    cohere = app_client.post(COHERE, json={"texts": ["x" * 2000]})
    assert cohere.status_code == 400 and cohere.json() == {"message": "request body is over the 1000 byte limit"}
