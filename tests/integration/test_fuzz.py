"""Every route of /openapi.json, fuzzed with hypothesis: no input may produce a 5xx or kill a service."""

from __future__ import annotations

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.integration

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=24),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=10,
)
# values shaped like the real fields, valid or nearly so
plausible = st.one_of(
    st.text(max_size=40),
    st.lists(st.text(max_size=30), min_size=0, max_size=5),
    st.lists(st.integers(-5, 40000), min_size=0, max_size=8),
    st.lists(st.lists(st.integers(0, 40000), max_size=6), max_size=3),
    st.sampled_from(["float", "base64", "query", "document", "Left", "Right", "all-MiniLM-L6-v2"]),
    st.sampled_from(["search_query", "search_document", "NONE", "START", "END"]),  # Cohere's input_type, truncate
    st.lists(st.sampled_from(["float", "int8", "uint8", "binary", "ubinary", "base64"]), max_size=3),  # embedding_types
    st.integers(-3, 5000),
    st.booleans(),
)


def body_strategy(schema: dict) -> st.SearchStrategy[bytes]:
    props = sorted(schema.get("properties", {}))
    shaped = st.fixed_dictionaries({}, optional={name: st.one_of(plausible, json_values) for name in props})
    return st.one_of(
        shaped.map(orjson.dumps),
        json_values.map(orjson.dumps),
        st.binary(max_size=64),
    )


@pytest.fixture(scope="module")
def spec(stack) -> dict:
    return httpx.get(f"{stack.base_url}/openapi.json").json()


def test_every_route_is_fuzzed(spec):
    posts = [p for p, ops in spec["paths"].items() if "post" in ops]
    assert sorted(posts) == sorted(
        [
            "/embed",
            "/embed_all",
            "/embed_sparse",
            "/embeddings",
            "/rerank",
            "/tokenize",
            "/v1/embeddings",
            "/v1/jobs",
            "/v1/rerank",
            "/v1/search",
            "/",
            "/decode",
            "/invocations",
            "/predict",
            "/similarity",
            "/v1/embed",
            "/v2/embed",
            "/v2/rerank",
        ]
    )


@pytest.mark.parametrize(
    "path",
    [
        "/v1/embeddings",
        "/embeddings",
        "/embed",
        "/embed_sparse",
        "/embed_all",
        "/tokenize",
        "/v1/jobs",
        "/rerank",
        "/v1/rerank",
        "/v1/search",
        "/predict",
        "/similarity",
        "/decode",
        "/",
        "/invocations",
        "/v1/embed",
        "/v2/embed",
        "/v2/rerank",
    ],
)
def test_post_routes_never_answer_5xx(stack, spec, path):
    schema = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    client = httpx.Client(base_url=stack.base_url, timeout=60)

    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(body=body_strategy(schema))
    def check(body: bytes) -> None:
        r = client.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code < 500, (body, r.status_code, r.text)
        assert r.headers["content-type"].startswith("application/json")

    check()
    assert all(s.alive for s in stack.services.values())


def test_get_routes(stack, spec):
    for path, ops in spec["paths"].items():
        if "get" in ops and "{" not in path:
            r = httpx.get(f"{stack.base_url}{path}", timeout=30)
            assert r.status_code == 200, (path, r.text)
