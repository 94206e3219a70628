"""Every route honours Accept on the real stack: a header that takes none of the media types a route
answers in (q=0 refuses a type; ``type/*`` and ``*/*`` take any of its) is a 406 in the route's own
error shape naming what it answers, before the route reads its body; no Accept, ``*/*`` or
``application/*`` get JSON, and the embedding routes' binary types their bytes."""

from __future__ import annotations

import httpx
import msgpack
import pytest

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"
JSON = "application/json"
BINARY = "application/json, application/octet-stream or application/msgpack"
TEXTS = {"model": MODEL, "texts": ["a cat", "a dog"]}
# method, path, a body it takes, its error shape, what it answers in
ROUTES = [
    ("POST", "/v1/embeddings", {"model": MODEL, "input": ["a cat"]}, "openai", BINARY),
    ("POST", "/embeddings", {"model": MODEL, "input": ["a cat"]}, "openai", BINARY),
    ("POST", "/v1/rerank", {"model": MODEL, "query": "cat", "documents": ["a cat", "a dog"]}, "openai", JSON),
    ("POST", "/v1/search", {"model": MODEL, "query": "cat"}, "openai", JSON),
    ("POST", "/v1/jobs", {"model": MODEL, "documents": []}, "openai", JSON),
    ("GET", "/v1/jobs", None, "openai", JSON),
    ("GET", "/v1/jobs/no-such-job", None, "openai", JSON),
    ("DELETE", "/v1/jobs/no-such-job", None, "openai", JSON),
    ("GET", "/v1/models", None, "openai", JSON),
    ("POST", "/embed", {"inputs": ["a cat"]}, "tei", BINARY),
    ("POST", "/embed_sparse", {"inputs": ["a cat"]}, "tei", JSON),
    ("POST", "/embed_all", {"inputs": ["a cat"]}, "tei", JSON),
    ("POST", "/tokenize", {"inputs": ["a cat"]}, "tei", JSON),
    ("POST", "/decode", {"ids": [101, 102]}, "tei", JSON),
    ("POST", "/rerank", {"query": "cat", "texts": ["a cat", "a dog"]}, "tei", JSON),
    ("POST", "/predict", {"inputs": "a cat"}, "tei", JSON),
    ("POST", "/similarity", {"inputs": {"source_sentence": "a cat", "sentences": ["a dog"]}}, "tei", JSON),
    ("POST", "/", {"inputs": ["a cat"]}, "tei", BINARY),
    ("POST", "/invocations", {"inputs": ["a cat"]}, "tei", BINARY),
    ("GET", "/info", None, "tei", JSON),
    ("POST", "/v1/embed", TEXTS, "cohere", JSON),
    ("POST", "/v2/embed", {**TEXTS, "input_type": "search_document"}, "cohere", JSON),
    ("POST", "/v2/rerank", {"model": MODEL, "query": "cat", "documents": ["a cat"]}, "cohere", JSON),
    ("GET", "/health", None, "openai", JSON),
    ("GET", "/openapi.json", None, "openai", JSON),
]
IDS = [f"{method} {path}" for method, path, *_ in ROUTES]


def _call(stack, method: str, path: str, body, accept: str | None) -> httpx.Response:
    headers = {} if accept is None else {"accept": accept}
    with httpx.Client(timeout=60) as client:
        request = client.build_request(method, f"{stack.base_url}{path}", json=body, headers=headers)
        if accept is None:
            del request.headers["accept"]  # httpx sends */* unless told otherwise
        return client.send(request)


def _message(r: httpx.Response, shape: str) -> str:
    """The error's message, once the body is the route's error shape saying 406."""
    body = r.json()
    if shape == "tei":
        assert set(body) == {"error", "error_type"}, body
        return body["error"]
    if shape == "cohere":
        assert set(body) == {"message"}, body
        return body["message"]
    assert body["error"]["code"] == "not_acceptable" and body["error"]["param"] == "accept", body
    return body["error"]["message"]


@pytest.mark.parametrize("accept", ["text/csv", "application/json;q=0", "text/*, image/png"])
@pytest.mark.parametrize("method, path, body, shape, answers", ROUTES, ids=IDS)
def test_an_accept_no_answer_satisfies_is_406_naming_what_the_route_answers(
    stack, method, path, body, shape, answers, accept
):
    r = _call(stack, method, path, body, accept)
    assert r.status_code == 406, (r.status_code, r.text)
    assert r.headers["content-type"] == JSON
    assert _message(r, shape) == f"{method} {path} answers {answers}; the request's Accept takes none of them"


@pytest.mark.parametrize(
    "accept", [None, "*/*", "application/*", "text/csv, application/json;q=0.5", "APPLICATION/JSON"]
)
@pytest.mark.parametrize("method, path, body, shape, answers", ROUTES, ids=IDS)
def test_no_accept_or_one_json_satisfies_is_answered_in_json(stack, method, path, body, shape, answers, accept):
    r = _call(stack, method, path, body, accept)
    assert r.status_code != 406, r.text  # the route's answer (200), or its own error (a model that cannot)
    assert r.headers["content-type"].split(";")[0] == JSON, r.headers
    r.json()


@pytest.mark.parametrize("path, body", [(p, b) for _, p, b, _, a in ROUTES if a == BINARY], ids=lambda x: str(x))
def test_binary_types_by_their_weights(stack, path, body):
    """The embedding routes answer the type of the highest weight (ties: the most specific range, then the
    order given); a binary type at q=0 is never answered."""
    cases = {
        "application/octet-stream": "application/octet-stream",
        "application/json, application/msgpack": JSON,
        "application/json;q=0.5, application/msgpack": "application/msgpack",
        "*/*, application/x-msgpack": "application/msgpack",
        "application/octet-stream;q=0, */*": JSON,
    }
    for accept, media in cases.items():
        r = _call(stack, "POST", path, body, accept)
        assert r.status_code == 200, (accept, r.text)
        assert r.headers["content-type"].split(";")[0] == media, accept
        if media == "application/msgpack":
            assert msgpack.unpackb(r.content)["rows"] == 1


def test_metrics_answer_prometheus_text_and_nothing_else(stack):
    scraper = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
    for accept in (None, "*/*", "text/plain", scraper):
        r = _call(stack, "GET", "/metrics", None, accept)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), (accept, r.text[:200])
    r = _call(stack, "GET", "/metrics", None, JSON)
    assert r.status_code == 406, r.text[:200]
    assert _message(r, "openai") == "GET /metrics answers text/plain; the request's Accept takes none of them"
