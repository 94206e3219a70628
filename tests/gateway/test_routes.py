"""The one route table: every route the app serves is in it once, /openapi.json describes exactly its
routes, every handler exists, and each path's errors take its API's shape."""

from __future__ import annotations

import orjson
import pytest

from embedfleet.services.gateway.app import Gateway
from embedfleet.services.gateway.http.errors import error_response
from embedfleet.services.gateway.openapi import openapi_spec
from embedfleet.services.gateway.routes import EMBED_PATHS, PATHS, ROUTES, Api, api_of
from embedfleet.shared.errors import ErrorCode


def test_each_route_is_declared_once_and_answered_by_a_gateway_method():
    pairs = [(route.path, route.method) for route in ROUTES]
    assert len(pairs) == len(set(pairs))
    for route in ROUTES:
        assert callable(getattr(Gateway, route.handler, None)), route


def test_a_path_has_one_error_shape_whatever_its_method():
    shapes: dict[str, set[Api]] = {}
    for route in ROUTES:
        shapes.setdefault(route.path, set()).add(route.api)
    assert all(len(found) == 1 for found in shapes.values()), shapes


def test_openapi_describes_exactly_the_declared_routes():
    spec = openapi_spec("test")
    described = {(path, method.upper()) for path, item in spec["paths"].items() for method in item}
    assert described == {(route.path, route.method) for route in ROUTES}
    assert set(spec["paths"]) == PATHS


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.path}")
def test_openapi_documents_each_route_s_406_in_its_api_s_error_shape(route):
    """The middleware refuses an Accept a route cannot answer (http/test_accept.py): each route documents it."""
    responses = openapi_spec("test")["paths"][route.path][route.method.lower()]["responses"]
    shapes = {code: r["content"]["application/json"]["schema"] for code, r in responses.items() if code[0] == "4"}
    assert "406" in shapes and "403" in shapes and ("415" in shapes) == (route.method == "POST")
    assert all(shape == shapes["406"] for shape in shapes.values()), route


def test_the_embedding_routes_are_the_ones_that_take_texts_to_vectors():
    assert {"/v1/embeddings", "/embeddings", "/embed", "/v1/embed", "/v2/embed"} == EMBED_PATHS


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.path}")
def test_each_route_s_errors_take_its_api_s_shape(route):
    body = orjson.loads(error_response(route.path, ErrorCode.INPUT_TOO_LONG, "too long").body)
    if route.api is Api.TEI:
        assert body == {"error": "too long", "error_type": "Validation"}
    elif route.api is Api.COHERE:
        assert body == {"message": "too long"}
    else:
        assert body["error"]["message"] == "too long" and body["error"]["code"] == "input_too_long"
    assert api_of(route.path) is route.api


def test_a_path_no_route_has_answers_in_openai_s_shape():
    assert api_of("/no/such/route") is Api.OPENAI
    assert orjson.loads(error_response("/no/such/route", ErrorCode.ROUTE_NOT_FOUND, "Not Found").body)["error"][
        "message"
    ]
