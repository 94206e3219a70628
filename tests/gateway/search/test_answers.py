"""POST /v1/search's answer held to its model (services/gateway/search/answers.py): what
search_api.render_search writes, plain and reranked, and /openapi.json's schema made from it."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from pydantic import ValidationError

from embedfleet.services.gateway.openapi import openapi_spec, typed_schema
from embedfleet.services.gateway.search.answers import SearchAnswer, SearchHit
from embedfleet.services.gateway.search.api import render_search
from embedfleet.shared.sinks import Hit

HITS = [
    Hit("a", 0.9, {"k": 1, "lang": "en", "ok": True}),
    Hit("b", 0.8, {}, chunk=2, text="bee"),
    Hit("c", 1.0, {"k": 3}, text="sea"),
]


def _held(body: bytes) -> SearchAnswer:
    answer = SearchAnswer.model_validate_json(body)  # strict: every field named, of its type
    assert answer.model_dump(mode="json", exclude_unset=True) == orjson.loads(body)
    return answer


def test_openapi_documents_the_answer_by_its_model():
    spec = orjson.loads(orjson.dumps(openapi_spec("test")))
    defs: dict = {}
    ok = spec["paths"]["/v1/search"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == orjson.loads(orjson.dumps(typed_schema(SearchAnswer, defs)))
    assert set(defs) == {"SearchHit", "SearchUsage"}
    assert {name: spec["components"]["schemas"][name] for name in defs} == orjson.loads(orjson.dumps(defs))


@pytest.mark.parametrize("hits", [HITS, HITS[1:2], []], ids=["hits", "a-chunk", "none"])
def test_a_plain_answer_is_a_search_answer(hits):
    answer = _held(render_search("m", hits, 7))
    assert "rerank_model" not in answer.model_fields_set
    assert all("rerank_score" not in hit.model_fields_set for hit in answer.data)


def test_a_reranked_answer_is_a_search_answer():
    body = render_search("m", HITS, 7, "r", np.array([2, 0], np.int32), np.array([0.5, 0.25], np.float32))
    answer = _held(body)
    assert answer.rerank_model == "r" and [h.rerank_score for h in answer.data] == [0.5, 0.25]
    assert [(h.id, h.chunk, h.text) for h in answer.data] == [("c", None, "sea"), ("a", None, None)]


def test_a_wrong_answer_is_refused():
    body = orjson.loads(render_search("m", HITS, 7))
    hit = body["data"][1]
    SearchAnswer.model_validate_json(orjson.dumps({**body, "data": [hit]}))  # each wrong one differs in one thing
    for wrong in (
        {**{k: v for k, v in body.items() if k != "data"}, "results": body["data"]},  # a field renamed
        {**body, "data": [{**hit, "chunk": None}]},  # absent, never null
        {**body, "data": [{**hit, "object": "embedding"}]},
        {**body, "data": [{k: v for k, v in hit.items() if k != "metadata"}]},
        {**body, "usage": {"prompt_tokens": 7}},
    ):
        with pytest.raises(ValidationError):
            SearchAnswer.model_validate_json(orjson.dumps(wrong))
    with pytest.raises(ValidationError):
        SearchHit.model_validate_json(orjson.dumps({**hit, "score": "0.8"}))
