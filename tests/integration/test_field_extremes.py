"""Every field of every POST route at its extremes: 0, negative, huge, fractional, wrong type, empty,
too long, too many. Each answer is a 2xx or a 4xx in the route's own error shape — never a 5xx — and
every service is alive afterwards.

A route's fields are read from the gateway's /openapi.json, so a field or route added there is
driven here too; each route needs a valid base body below (the test fails for one without)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest

from embedfleet.services.gateway.routes import Api, api_of

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"
# a valid request per route, which each case changes in one field
BASES: dict[str, dict] = {
    "/v1/embeddings": {"model": MODEL, "input": ["hello world"]},
    "/embeddings": {"model": MODEL, "input": ["hello world"]},
    "/embed": {"inputs": ["hello world"]},
    "/embed_all": {"inputs": ["hello world"]},
    "/embed_sparse": {"inputs": ["hello world"]},
    "/tokenize": {"inputs": ["hello world"]},
    "/rerank": {"query": "what is a fox", "texts": ["a fox is an animal", "a car"]},
    "/v1/rerank": {"model": MODEL, "query": "what is a fox", "documents": ["a fox is an animal", "a car"]},
    "/v1/jobs": {"documents": [{"id": "extreme", "text": "hello world"}]},
    "/v1/search": {"query": "what is a fox", "top_k": 3},
    "/v1/embed": {"model": MODEL, "texts": ["hello world"]},
    "/v2/embed": {
        "model": MODEL,
        "texts": ["hello world"],
        "input_type": "search_document",
        "embedding_types": ["float"],
    },
    "/v2/rerank": {"model": MODEL, "query": "what is a fox", "documents": ["a fox is an animal", "a car"]},
    "/": {"inputs": "hello world"},
    "/invocations": {"inputs": "hello world"},
    "/similarity": {"inputs": {"source_sentence": "a fox", "sentences": ["a fox is an animal", "a car"]}},
    "/predict": {"inputs": "hello world"},
    "/decode": {"ids": [101, 7592, 2088, 102]},
}
EXTREMES = [
    0,
    -1,
    1,
    -(2**63),
    2**63 - 1,
    2**64 - 1,
    0.5,
    -1e308,
    1e308,
    True,
    None,
    "",
    "\u0000",
    "x" * 70_000,
    "Left",
    "float",
    [],
    [""],
    [0],
    [-1],
    [2**31],
    [[2**31 - 1]],
    [[]],
    ["x"] * 5000,
    [None],
    [{"text": 1}],
    {},
    {"a": {"b": []}},
]


def _cases(spec: dict) -> list[tuple[str, str, object]]:
    cases = []
    for path, ops in sorted(spec["paths"].items()):
        if "post" not in ops:
            continue
        schema = ops["post"]["requestBody"]["content"]["application/json"]["schema"]
        for field in sorted(schema.get("properties", {})):
            cases += [(path, field, value) for value in EXTREMES]
    return cases


@pytest.fixture(scope="module")
def spec(stack) -> dict:
    return httpx.get(f"{stack.base_url}/openapi.json").json()


def test_every_post_route_has_a_base_body(spec):
    posts = {p for p, ops in spec["paths"].items() if "post" in ops}
    assert posts <= set(BASES), f"add a valid base body for {sorted(posts - set(BASES))}"


def _failure(client: httpx.Client, path: str, field: str, value: object) -> tuple | None:
    """Why the answer to ``path``'s base body with ``field`` set to ``value`` is wrong (None: it is right)."""
    body = {**BASES[path], field: value}
    try:
        r = client.post(path, content=orjson.dumps(body), headers={"content-type": "application/json"})
    except httpx.HTTPError as exc:  # the connection dropped: as bad as a 5xx
        return path, field, repr(value)[:40], "no answer", repr(exc)
    if r.status_code == 429:  # refused for load: the case went unchecked
        return path, field, repr(value)[:40], r.status_code, r.text[:200]
    if r.status_code >= 500 or not r.headers.get("content-type", "").startswith("application/json"):
        return path, field, repr(value)[:40], r.status_code, r.text[:200]
    if r.status_code >= 400:
        error = r.json()
        if api_of(path) is Api.TEI:
            ok = isinstance(error.get("error"), str) and "error_type" in error
        elif api_of(path) is Api.COHERE:  # Cohere's: {"message"}
            ok = isinstance(error.get("message"), str)
        else:
            ok = isinstance(error.get("error"), dict) and isinstance(error["error"].get("message"), str)
        if not ok:
            return path, field, repr(value)[:40], r.status_code, "error shape: " + r.text[:200]
    return None


def test_every_field_at_its_extremes_gets_a_2xx_or_4xx(stack, spec):
    cases = _cases(spec)
    assert len(cases) > 200
    # four cases at a time: the cases that are embedded keep both workers busy, and the gateway sees
    # concurrent hostile requests too
    with httpx.Client(base_url=stack.base_url, timeout=60) as client, ThreadPoolExecutor(4) as pool:
        failures = [f for f in pool.map(lambda case: _failure(client, *case), cases) if f is not None]
    assert not failures, f"{len(failures)} of {len(cases)} cases: {failures[:10]}"
    assert all(s.alive for s in stack.services.values())
    r = httpx.post(f"{stack.base_url}/v1/embeddings", json=BASES["/v1/embeddings"], timeout=60)
    assert r.status_code == 200, r.text
