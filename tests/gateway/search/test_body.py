"""POST /v1/search's typed body: /openapi.json's request schema is the model's and names exactly the
fields the route reads, and the route accepts what the schema accepts and refuses what it refuses
(each refusal naming its field)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Limits
from embedfleet.services.gateway.search.api import parse_search
from embedfleet.services.gateway.search.body import SearchBody
from tests.gateway.typed_bodies import added_field, is_generated, scalar_cases, served_body

LIMITS = Limits(max_inputs=2048, max_input_chars=100_000)  # past the model's bounds: only the schema's count
BASE: dict[str, Any] = {"query": "q"}


def _parses(doc: dict[str, Any]) -> bool:
    """Whether the route takes ``doc``; its refusal must name the field it changes from BASE."""
    try:
        parse_search(json.dumps(doc).encode(), LIMITS)  # json: integers past 64 bits too
    except ApiError as exc:
        (field,) = set(doc) - set(BASE) or {"query"}
        assert exc.status == 400 and exc.param is not None and exc.param.split(".")[0] == field, exc.message
        return False
    return True


def test_openapi_body_is_the_model_s_generated_schema():
    assert is_generated("/v1/search", SearchBody)
    served, components = served_body("/v1/search")
    assert set(served["properties"]) == {"model", "query", "table", "top_k", "filter", "rerank"}
    assert served["required"] == ["query"]
    rerank = components["SearchRerankBody"]
    assert rerank["additionalProperties"] is False and rerank["required"] == ["model"]


def test_a_field_added_to_the_model_is_in_the_served_schema(monkeypatch):
    assert added_field(monkeypatch, "/v1/search", "SearchBody") == {"default": 0, "title": "Added", "type": "integer"}


@pytest.mark.parametrize("field", ["model", "query", "table", "top_k"])
def test_the_route_accepts_what_the_schema_accepts_and_refuses_the_rest(field):
    served, _ = served_body("/v1/search")
    cases = scalar_cases(served["properties"][field])
    assert cases is not None
    accepted, refused = cases
    assert all(_parses({**BASE, field: value}) for value in accepted)
    assert not any(_parses({**BASE, field: value}) for value in refused)


def test_the_filter_takes_what_its_schema_takes():
    served, _ = served_body("/v1/search")
    (schema, _null) = served["properties"]["filter"]["anyOf"]
    assert schema["additionalProperties"] is False
    ((pattern, value),) = schema["patternProperties"].items()
    text, number, flag = value["anyOf"]
    assert flag == {"type": "boolean"}
    most = schema["maxProperties"]
    for name in ("lang", "a-b_1", "_", "x" * 64):
        assert re.match(pattern, name) and _parses({**BASE, "filter": {name: "en"}})
    for name in ("a.b", "", "-a", "x" * 65, "a b"):
        assert not re.match(pattern, name) and not _parses({**BASE, "filter": {name: "en"}})
    taken = ["x" * text["maxLength"], number["minimum"], number["exclusiveMaximum"] - 1, True, False, ""]
    assert all(_parses({**BASE, "filter": {"k": v}}) for v in taken)
    refused = ["x" * (text["maxLength"] + 1), number["minimum"] - 1, number["exclusiveMaximum"], 1.5, None, [], {}]
    assert not any(_parses({**BASE, "filter": {"k": v}}) for v in refused)
    assert _parses({**BASE, "filter": {f"f{i}": i for i in range(most)}})
    assert not _parses({**BASE, "filter": {f"f{i}": i for i in range(most + 1)}})


def test_the_rerank_takes_what_its_schema_takes():
    _, components = served_body("/v1/search")
    rerank = components["SearchRerankBody"]["properties"]
    model, top_n = rerank["model"], rerank["top_n"]["anyOf"][0]
    assert _parses({**BASE, "rerank": {"model": "x" * model["maxLength"], "top_n": top_n["minimum"]}})
    assert _parses({**BASE, "rerank": {"model": "r", "top_n": None}})
    for bad in (
        {"model": "x" * (model["maxLength"] + 1)},
        {"model": "x" * (model["minLength"] - 1)},
        {"model": "r", "top_n": top_n["minimum"] - 1},
        {"model": "r", "top_k": 3},
        {"top_n": 3},
        "r",
    ):
        assert not _parses({**BASE, "rerank": bad}), bad
