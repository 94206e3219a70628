"""Accept weighed against what a route answers in (services/gateway/http/accept.py), and the routes' media
types that the gateway's middleware refuses an Accept against (services/gateway/http/route_media.py)."""

from __future__ import annotations

import pytest

from embedfleet.services.gateway.http.accept import Offer, chosen, named
from embedfleet.services.gateway.http.formats import BINARY, JSON_ONLY
from embedfleet.services.gateway.http.route_media import RouteMedia
from embedfleet.services.gateway.routes import ROUTES


@pytest.mark.parametrize(
    "accept, kind",
    [
        (None, "json"),
        ("", "json"),
        (" , ", "json"),
        ("*", "json"),
        ("application/*", "json"),
        ("APPLICATION/OCTET-STREAM", "octet"),
        ("application/json;q=0, application/*", "octet"),  # the most specific range gives json's weight
        ("application/json;q=0.2, application/msgpack;q=0.3", "msgpack"),
        ("application/json;q=x, application/octet-stream;q=0.1", "octet"),  # a weight that is no number: 0
        ("text/csv", None),
        ("application/json;q=0, application/octet-stream;q=0, application/*msgpack", None),
        ("*/*;q=0", None),
    ],
)
def test_the_type_of_the_highest_weight_is_chosen(accept, kind):
    offer = chosen(accept, BINARY)
    assert (offer.kind if offer else None) == kind


def test_what_a_route_answers_is_named_once_a_kind():
    assert named(BINARY) == "application/json, application/octet-stream or application/msgpack"
    assert named(JSON_ONLY) == "application/json"
    assert named((Offer("a/b", "x"), Offer("c/d", "y"))) == "a/b or c/d"


def test_every_route_but_the_results_is_refused_an_accept_it_cannot_answer():
    media = RouteMedia()
    for route in ROUTES:
        path = route.path.replace("{job}", "job-1")
        refused = media.refusal(route.method, path, "text/csv")
        if route.path == "/v1/jobs/{job}/results":
            assert refused is None  # NDJSON or Parquet: weighed by the route itself
            continue
        assert refused is not None and refused.status == 406 and refused.param == "accept", route
        assert refused.message.startswith(f"{route.method} {path} answers "), refused.message
        assert media.refusal(route.method, path, None) is None
    assert media.refusal("GET", "/v1/embeddings", "text/csv") is None  # no such route: 405 is the route's
    assert media.refusal("POST", "/nowhere", "text/csv") is None  # 404
    assert media.refusal("GET", "/metrics", "text/*") is None
