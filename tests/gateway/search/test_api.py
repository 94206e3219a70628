"""POST /v1/search's request fields and answer, in-process: defaults, every refusal with its parameter
in OpenAI's error shape, and the answer's rows in the store's or the reranker's order."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Limits
from embedfleet.services.gateway.search.api import (
    DEFAULT_TOP_K,
    MAX_TOP_K,
    RerankAsk,
    SearchCall,
    parse_search,
    render_search,
)
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.sinks import Hit

LIMITS = Limits(max_inputs=2048, max_input_chars=100)


def _parse(**body) -> SearchCall:
    return parse_search(orjson.dumps(body), LIMITS)


def test_defaults_and_every_field():
    assert _parse(query="q") == SearchCall(None, "q", DEFAULT_TOP_K, {}, None)
    call = _parse(
        model="m",
        query="q",
        top_k=3,
        filter={"lang": "en", "year": 2020, "ok": True},
        rerank={"model": "r", "top_n": 2},
    )
    assert call == SearchCall("m", "q", 3, {"lang": "en", "year": 2020, "ok": True}, RerankAsk("r", 2))
    assert _parse(query="q", rerank={"model": "r"}).rerank == RerankAsk("r", None)
    assert _parse(query="q", filter=None, rerank=None, top_k=None) == SearchCall(None, "q", DEFAULT_TOP_K, {}, None)
    assert _parse(query="q", top_k=MAX_TOP_K).top_k == MAX_TOP_K
    assert _parse(query="q", filter={"n": 2**63 - 1, "m": -(2**63)}).where == {"n": 2**63 - 1, "m": -(2**63)}
    assert _parse(query="q", unknown={"x": 1}).query == "q"  # unknown fields are ignored
    assert parse_search(orjson.dumps({"query": "q", "top_k": 50}), Limits(50, 100)).top_k == 50


@pytest.mark.parametrize(
    "body, param, message",
    [
        ({}, "query", "'query' is required"),
        ({"query": ""}, "query", "'query' must not be an empty string"),
        ({"query": 5}, "query", "'query' must be a string, got 5"),
        ({"query": "q", "model": ""}, "model", "'model' must not be an empty string"),
        ({"query": "q", "model": 3}, "model", "'model' must be a string, got 3"),
        ({"query": "q", "model": "m" * 257}, "model", "'model' has 257 characters; the limit is 256"),
        ({"query": "q", "top_k": 0}, "top_k", "'top_k' must be at least 1, got 0"),
        ({"query": "q", "top_k": MAX_TOP_K + 1}, "top_k", "'top_k' must be at most 1000, got 1001"),
        ({"query": "q", "top_k": 2.5}, "top_k", "'top_k' must be an integer, got 2.5"),
        ({"query": "q", "top_k": True}, "top_k", "'top_k' must be an integer, got true"),
        ({"query": "q", "filter": ["lang"]}, "filter", "'filter' must be an object, got array"),
        ({"query": "q", "filter": {"lang": 1.5}}, "filter", "'filter.lang' must be a string, an integer (64 bits) or a boolean, got number"),
        ({"query": "q", "filter": {"lang": None}}, "filter", "'filter.lang' must be a string, an integer (64 bits) or a boolean, got null"),
        ({"query": "q", "filter": {"lang": ["en"]}}, "filter", "'filter.lang' must be a string, an integer (64 bits) or a boolean, got array"),
        ({"query": "q", "filter": {"n": 2**63}}, "filter", "'filter.n' must be a string, an integer (64 bits) or a boolean, got number"),
        ({"query": "q", "filter": {"n": -(2**63) - 1}}, "filter", "'filter.n' must be a string, an integer (64 bits) or a boolean, got number"),
        ({"query": "q", "filter": {"a.b": "x"}}, "filter", "'filter' field 'a.b' is not a plain name (letters, digits, _ -, at most 64)"),
        ({"query": "q", "filter": {"": "x"}}, "filter", "'filter' field '' is not a plain name (letters, digits, _ -, at most 64)"),
        ({"query": "q", "filter": {"f" * 65: "x"}}, "filter", f"'filter' field {'f' * 65!r} is not a plain name (letters, digits, _ -, at most 64)"),
        ({"query": "q", "filter": {"s": "x" * 1025}}, "filter", "'filter.s' has 1025 characters; the limit is 1024"),
        ({"query": "q", "filter": {f"f{i}": i for i in range(17)}}, "filter", "'filter' has 17 fields; the limit is 16"),
        ({"query": "q", "rerank": "r"}, "rerank", "'rerank' must be an object, got 'r'"),
        ({"query": "q", "rerank": {}}, "rerank.model", "'rerank.model' is required"),
        ({"query": "q", "rerank": {"model": ""}}, "rerank.model", "'rerank.model' must not be an empty string"),
        ({"query": "q", "rerank": {"model": "r", "top_k": 3}}, "rerank", "'rerank' has unknown keys 'top_k'"),
        ({"query": "q", "rerank": {"model": "r", "top_n": 0}}, "rerank.top_n", "'rerank.top_n' must be at least 1, got 0"),
        ({"query": "q", "rerank": {"model": "r", "top_n": "3"}}, "rerank.top_n", "'rerank.top_n' must be an integer, got '3'"),
    ],
)  # fmt: skip
def test_refusals_name_their_field(body, param, message):
    with pytest.raises(ApiError) as err:
        parse_search(json.dumps(body).encode(), LIMITS)  # json: integers past 64 bits too
    assert (err.value.code, err.value.param, err.value.message) == (ErrorCode.INVALID_REQUEST, param, message)
    error = orjson.loads(err.value.response("/v1/search").body)["error"]
    assert error == {"message": message, "type": "invalid_request_error", "param": param, "code": "invalid_request"}


def test_a_query_longer_than_the_gateway_takes_is_413():
    with pytest.raises(ApiError) as err:
        parse_search(orjson.dumps({"query": "x" * 101}), LIMITS)
    assert (err.value.status, err.value.param) == (413, "query")
    assert err.value.message == "'query' has 101 characters; the limit is 100"


def test_top_k_is_bounded_by_the_gateway_s_max_inputs_too():
    with pytest.raises(ApiError) as err:
        parse_search(orjson.dumps({"query": "q", "top_k": 21}), Limits(20, 100))
    assert (err.value.status, err.value.param) == (400, "top_k")
    assert err.value.message == "'top_k' must be at most 20 (the gateway's --max-inputs), got 21"


HITS = [Hit("a", 0.9, {"k": 1}), Hit("b", 0.8, {}, chunk=2, text="bee"), Hit("c", 0.7, {"k": 3}, text="sea")]


def test_the_answer_keeps_the_store_s_order_and_says_only_what_rows_have():
    body = orjson.loads(render_search("m", HITS, 7))
    assert body == {
        "object": "list",
        "model": "m",
        "data": [
            {"object": "search_result", "id": "a", "score": 0.9, "metadata": {"k": 1}},
            {"object": "search_result", "id": "b", "chunk": 2, "score": 0.8, "text": "bee", "metadata": {}},
            {"object": "search_result", "id": "c", "score": 0.7, "text": "sea", "metadata": {"k": 3}},
        ],
        "usage": {"prompt_tokens": 7, "total_tokens": 7},
    }
    assert orjson.loads(render_search("m", [], 3))["data"] == []


def test_a_reranked_answer_is_in_the_reranker_s_order_with_both_scores():
    body = orjson.loads(render_search("m", HITS, 7, "r", np.array([2, 0], np.int32), np.array([0.5, 0.25], np.float32)))
    assert body["rerank_model"] == "r"
    assert [(d["id"], d["score"], d["rerank_score"]) for d in body["data"]] == [("c", 0.7, 0.5), ("a", 0.9, 0.25)]
