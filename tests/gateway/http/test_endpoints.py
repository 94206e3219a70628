"""Routes run straight from the middleware: the table holds exact (method, path) routes only, and an
endpoint's exceptions are answered by the app's handlers as starlette would (the unexpected one answered,
then raised on; a client gone raised with no answer)."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from embedfleet.services.gateway.http.endpoints import Endpoints
from embedfleet.services.gateway.http.errors import ApiError, error_response
from embedfleet.shared.errors import ErrorCode


async def ok(request: Request) -> Response:
    return Response(await request.body(), media_type="application/json")


async def refused(request: Request) -> Response:
    raise ApiError(ErrorCode.INVALID_REQUEST, "bad field", "input")


async def broken(request: Request) -> Response:
    raise RuntimeError("a bug")


async def left(request: Request) -> Response:
    raise ClientDisconnect()


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response(request.url.path)


async def unexpected(request: Request, exc: Exception) -> Response:
    return error_response(request.url.path, ErrorCode.INTERNAL, "internal error")


ROUTES = [
    Route("/ok", ok, methods=["POST"]),
    Route("/embed", refused, methods=["POST"]),
    Route("/broken", broken, methods=["POST"]),
    Route("/left", left, methods=["POST"]),
    Route("/jobs/{job}", ok, methods=["GET"]),
    Route("/info", ok, methods=["GET"]),
]
ENDPOINTS = Endpoints(ROUTES, {ApiError: api_error, Exception: unexpected})


def call(method: str, path: str, body: bytes = b"") -> list[dict]:
    """The messages the endpoint of (method, path) sends for a request of ``body``."""
    sent: list[dict] = []
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [],
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "server": ("127.0.0.1", 80),
    }

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    endpoint = ENDPOINTS.get(method, path)
    assert endpoint is not None
    asyncio.run(ENDPOINTS.run(endpoint, scope, receive, send))
    return sent


def test_only_exact_routes_are_in_the_table_with_head_for_get():
    assert ENDPOINTS.get("POST", "/ok") is ok
    assert ENDPOINTS.get("GET", "/info") is ok and ENDPOINTS.get("HEAD", "/info") is ok
    assert ENDPOINTS.get("GET", "/ok") is None  # a method the route lacks: starlette answers 405
    assert ENDPOINTS.get("GET", "/jobs/{job}") is None and ENDPOINTS.get("GET", "/jobs/7") is None
    assert ENDPOINTS.get("POST", "/ok/") is None  # starlette redirects


def test_an_endpoint_s_answer_is_sent():
    start, body = call("POST", "/ok", b'{"a": 1}')
    assert (start["type"], start["status"], body["body"]) == ("http.response.start", 200, b'{"a": 1}')


def test_an_api_error_is_answered_in_the_route_s_shape():
    start, body = call("POST", "/embed")
    assert start["status"] == 400
    assert orjson.loads(body["body"]) == {"error": "bad field", "error_type": "Validation"}


def test_an_unexpected_error_is_answered_500_then_raised_on():
    sent: list[dict] = []
    with pytest.raises(RuntimeError, match="a bug"):

        async def run() -> None:
            async def receive() -> dict:
                return {"type": "http.request", "body": b"", "more_body": False}

            async def send(message: dict) -> None:
                sent.append(message)

            scope = {
                "type": "http",
                "method": "POST",
                "path": "/broken",
                "headers": [],
                "query_string": b"",
                "root_path": "",
                "scheme": "http",
                "server": ("127.0.0.1", 80),
            }
            await ENDPOINTS.run(broken, scope, receive, send)

        asyncio.run(run())
    assert sent[0]["status"] == 500
    assert orjson.loads(sent[1]["body"])["error"] == {
        "message": "internal error",
        "type": "server_error",
        "param": None,
        "code": "internal",
    }


def test_a_client_gone_is_raised_with_no_answer():
    with pytest.raises(ClientDisconnect):
        call("POST", "/left")
