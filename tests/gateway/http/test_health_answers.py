"""GET /health's answers (and GET /, /ping: the same) held to their models (services/gateway/
http/health_answers.py): what health.health_answer writes, ready or not, plain or asked for models, and
/openapi.json's schemas made from them on each of the three paths."""

from __future__ import annotations

import orjson
import pytest
from pydantic import BaseModel, ValidationError

from embedfleet.services.gateway.http.health import Readiness, health_answer
from embedfleet.services.gateway.http.health_answers import Healthy, Unhealthy
from embedfleet.services.gateway.openapi import openapi_spec, typed_schema
from embedfleet.services.gateway.routes import ROUTES
from embedfleet.shared.nats.fleet import FleetView

HEALTH_PATHS = sorted(r.path for r in ROUTES if r.handler == "health")


def _view(tokenizers: list[str], workers: list[str]) -> FleetView:
    return FleetView({m: {"model": m} for m in tokenizers}, {m: {"model": m} for m in workers}, 0.0)


def _held(model: type[BaseModel], body: dict) -> BaseModel:
    raw = orjson.dumps(body)  # as the route writes it (http/formats.py's json_response: orjson)
    answer = model.model_validate_json(raw)  # strict: every field named, of its type
    assert answer.model_dump(mode="json", exclude_unset=True) == orjson.loads(raw)
    return answer


def test_the_three_paths_document_both_answers_by_their_models():
    assert HEALTH_PATHS == ["/", "/health", "/ping"]
    spec = orjson.loads(orjson.dumps(openapi_spec("test")))
    for path in HEALTH_PATHS:
        responses = spec["paths"][path]["get"]["responses"]
        for status, model in (("200", Healthy), ("503", Unhealthy)):
            schema = responses[status]["content"]["application/json"]["schema"]
            assert schema == orjson.loads(orjson.dumps(typed_schema(model, {}))), (path, status)


ASKS = [Readiness((), False), Readiness((), True), Readiness(("a", "never"), False), Readiness(("a",), True)]
VIEWS = [_view([], []), _view(["a"], []), _view([], ["a"]), _view(["a", "b"], ["a"]), _view(["a"], ["a"])]


@pytest.mark.parametrize("ask", ASKS, ids=["plain", "all", "models", "models-and-all"])
@pytest.mark.parametrize("view", VIEWS, ids=["nothing", "tokenizer", "worker", "half", "whole"])
def test_every_answer_is_healthy_or_unhealthy(view, ask):
    body, status = health_answer(view, ask)
    answer = _held(Healthy if status == 200 else Unhealthy, body)
    assert status in (200, 503)
    if status == 503:
        assert isinstance(answer, Unhealthy) and ("waiting" in answer.model_fields_set) == (not ask.plain)


def test_a_wrong_answer_is_refused():
    down, _ = health_answer(_view(["a"], []), Readiness((), True))
    Unhealthy.model_validate_json(orjson.dumps(down))  # each wrong one below differs from it in one thing
    for wrong in (
        {**{k: v for k, v in down.items() if k != "waiting"}, "missing": down["waiting"]},  # a field renamed
        {**down, "error_type": "Backend"},
        {**down, "waiting": None},
        {k: v for k, v in down.items() if k != "workers"},
    ):
        with pytest.raises(ValidationError):
            Unhealthy.model_validate_json(orjson.dumps(wrong))
    with pytest.raises(ValidationError):  # the 503 body is not the 200's
        Healthy.model_validate_json(orjson.dumps(down))
    with pytest.raises(ValidationError):
        Healthy.model_validate_json(b'{"status": "ok", "models": "a"}')
