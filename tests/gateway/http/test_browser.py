"""What keeps web pages off the gateway (services/gateway/http/browser.py): a Host the gateway is not served
as and an Origin not allowed are refused (403), a JSON route's body said to be another type too (415),
each in the route's error shape and before the route or the API key is looked at; an allowed origin's
page gets its preflight answered and may read the answers (CORS)."""

from __future__ import annotations

import socket

import pytest
from starlette.testclient import TestClient

from embedfleet.services.gateway.app import create_app
from embedfleet.services.gateway.config import GatewayConfig
from embedfleet.services.gateway.http.browser import JSON_POSTS, default_hosts, host_name, is_json, rules_of
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.nats.config import NatsConfig
from embedfleet.shared.nats.subjects import Subjects


def _config(**more) -> GatewayConfig:
    return GatewayConfig(NatsConfig("nats://127.0.0.1:4222", Subjects()), "127.0.0.1", 8080, 30.0, **more)


@pytest.fixture(scope="module")
def client():
    """The app without its lifespan (no NATS): what it answers before any route runs."""
    return TestClient(create_app(_config()), base_url="http://localhost:8080")


@pytest.mark.parametrize(
    ("host", "name"),
    [
        ("localhost:8080", "localhost"),
        ("LocalHost.", "localhost"),
        ("[::1]:8080", "::1"),
        ("::1", "::1"),
        ("127.0.0.1:80", "127.0.0.1"),
        ("evil.example:8080", "evil.example"),
        ("a:b", "a:b"),
    ],
)
def test_a_host_header_s_name(host, name):
    assert host_name(host) == name


def test_by_default_the_gateway_is_served_as_localhost_this_machine_and_its_bind_address():
    rules = rules_of((), (), "gw.internal")
    assert rules.hosts == default_hosts("gw.internal")
    for host in ("localhost", "localhost:8080", "app.localhost:1", "gw.internal:8080", socket.gethostname().lower()):
        assert rules.host_allowed(host), host
    # addresses, whatever the list: a rebinding page's Host is its own name
    for host in ("127.0.0.1:8080", "[::1]:8080", "10.1.2.3:8080", "[fe80::1]"):
        assert rules.host_allowed(host), host
    for host in ("evil.example", "evil.example:8080", "localhost.evil.example", "127.0.0.1.nip.io", "xlocalhost"):
        assert not rules.host_allowed(host), host
    assert rules.host_allowed(None)  # no Host: an HTTP/1.0 client, not a browser
    assert rules_of((), (), "0.0.0.0").hosts == default_hosts("::") == default_hosts("0.0.0.0")


def test_allowed_hosts_replace_the_names_a_dot_takes_subdomains_a_star_any():
    rules = rules_of(("gateway", ".svc.cluster.local", "API.example.com:443"), (), "127.0.0.1")
    for host in ("gateway", "gateway:80", "gateway.embedfleet.svc.cluster.local", "api.example.com", "10.0.0.7:8080"):
        assert rules.host_allowed(host), host
    for host in ("localhost", "evil.example", "cluster.local", "api.example.com.evil.example"):
        assert not rules.host_allowed(host), host
    assert rules_of(("*",), (), "127.0.0.1").host_allowed("anything.example")


def test_origins_are_web_origins_or_a_star():
    rules = rules_of((), ("https://App.example.com/", "http://localhost:3000"), "127.0.0.1")
    assert rules.origin_allowed("https://app.example.com") and rules.origin_allowed("http://localhost:3000")
    for origin in ("null", "https://app.example.com:444", "http://app.example.com", "https://evil.example"):
        assert not rules.origin_allowed(origin), origin
    assert rules_of((), ("*",), "127.0.0.1").origin_allowed("https://evil.example")
    for bad in ("app.example.com", "https://app.example.com/path", "https://"):
        with pytest.raises(ConfigError) as caught:
            _config(allowed_origins=(bad,))
        assert str(caught.value).startswith(f"--allowed-origins: {bad!r} is no web origin; give scheme://host[:port]")


@pytest.mark.parametrize(
    ("content_type", "json"),
    [
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/vnd.api+json", True),
        ("text/plain", False),
        ("text/plain;charset=UTF-8", False),
        ("application/x-www-form-urlencoded", False),
        ("multipart/form-data; boundary=x", False),
        ("text/json", False),
        ("", False),
    ],
)
def test_what_counts_as_json(content_type, json):
    assert is_json(content_type) is json


def test_every_post_route_takes_json():
    assert {"/v1/embeddings", "/v1/jobs", "/embed", "/v2/embed", "/v1/search", "/"} <= JSON_POSTS


def test_a_host_not_served_as_is_refused_before_anything(client):
    r = client.get("/health", headers={"host": "evil.example:8080"})
    assert r.status_code == 403
    assert r.json() == {
        "error": {
            "message": "Host 'evil.example' is not a name this gateway is served as (--allowed-hosts)",
            "type": "permission_error",
            "param": "host",
            "code": "forbidden",
        }
    }
    tei = client.post("/embed", headers={"host": "evil.example"}, json={"inputs": "hi"})
    assert tei.status_code == 403 and tei.json()["error_type"] == "Unauthorized"  # the route's shape


def test_an_origin_not_allowed_is_refused_whatever_the_method_or_body(client):
    for method, path in (("POST", "/v1/jobs"), ("GET", "/v1/models"), ("GET", "/metrics"), ("OPTIONS", "/v1/jobs")):
        r = client.request(
            method,
            path,
            headers={
                "origin": "http://evil.example",
                "content-type": "text/plain",
                "access-control-request-method": "POST",
            },
            content=b'{"documents": [{"id": "a", "text": "planted"}]}',
        )
        assert r.status_code == 403, (method, path, r.text)
        assert r.json()["error"]["param"] == "origin" and "'http://evil.example'" in r.json()["error"]["message"]
        assert "access-control-allow-origin" not in r.headers
    cohere = client.post("/v2/embed", headers={"origin": "null"}, json={"texts": ["hi"]})
    assert cohere.status_code == 403 and set(cohere.json()) == {"message"}


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_a_json_route_refuses_a_body_said_to_be_another_type(client, content_type):
    r = client.post("/v1/jobs", headers={"content-type": content_type}, content=b'{"documents": []}')
    assert r.status_code == 415, r.text
    assert r.json()["error"] == {
        "message": f"POST /v1/jobs takes a JSON body: send 'Content-Type: application/json' (not {content_type!r})",
        "type": "invalid_request_error",
        "param": "content-type",
        "code": "unsupported_media_type",
    }


def test_requests_without_an_origin_or_a_content_type_go_on_to_their_route(client):
    # the route's own answer: the body read as JSON, and refused as such
    r = client.post("/v1/embeddings", content=b"not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", r.text
    assert client.post("/v1/embeddings", json={"input": 1}).status_code == 400  # application/json


def test_an_allowed_origin_gets_its_preflight_answered_and_may_read_the_answers():
    client = TestClient(
        create_app(_config(allowed_origins=("https://app.example.com",))), base_url="http://localhost:8080"
    )
    pre = client.options(
        "/v1/embeddings",
        headers={
            "origin": "https://app.example.com",
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type",
        },
    )
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] == "https://app.example.com"
    assert "POST" in pre.headers["access-control-allow-methods"]
    assert "authorization" in pre.headers["access-control-allow-headers"].lower()
    answer = client.post("/v1/embeddings", headers={"origin": "https://app.example.com"}, content=b"not json")
    assert answer.status_code == 400 and answer.headers["access-control-allow-origin"] == "https://app.example.com"
    assert "x-request-id" in answer.headers["access-control-expose-headers"]
    # another origin: refused, preflight and all
    other = client.options(
        "/v1/embeddings", headers={"origin": "https://evil.example", "access-control-request-method": "POST"}
    )
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
