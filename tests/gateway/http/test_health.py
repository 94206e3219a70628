"""/health's liveness and readiness answers for a fleet view (services/gateway/http/health.py)."""

from __future__ import annotations

import pytest
from starlette.datastructures import QueryParams

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.http.health import Readiness, health_answer, parse_readiness
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.nats.fleet import FleetView


def _view(tokenizers: list[str], workers: list[str]) -> FleetView:
    return FleetView({m: {"model": m} for m in tokenizers}, {m: {"model": m} for m in workers}, 0.0)


@pytest.mark.parametrize(
    "query, want",
    [
        ("", Readiness((), False)),
        ("all=1", Readiness((), True)),
        ("all=true", Readiness((), True)),
        ("all", Readiness((), True)),
        ("all=0", Readiness((), False)),
        ("all=false", Readiness((), False)),
        ("model=a&model=org/b", Readiness(("a", "org/b"), False)),
        ("model=a&all=1", Readiness(("a",), True)),
    ],
)
def test_query(query, want):
    assert parse_readiness(QueryParams(query)) == want


def test_an_empty_model_name_is_refused():
    with pytest.raises(ApiError) as err:
        parse_readiness(QueryParams("model="))
    assert (err.value.code, err.value.param) == (ErrorCode.INVALID_REQUEST, "model")


def test_plain_health_is_any_model_served():
    # one model of three served, two half served (as while `up` starts the workers one at a time)
    view = _view(["a", "b", "c"], ["a"])
    assert health_answer(view, Readiness((), False)) == ({"status": "ok", "models": ["a"]}, 200)
    body, status = health_answer(_view(["a"], []), Readiness((), False))
    assert status == 503 and body["error"] == "no worker answers" and "waiting" not in body


def test_all_waits_for_every_half_served_model():
    body, status = health_answer(_view(["a", "b", "c"], ["a", "d"]), Readiness((), True))
    assert status == 503
    assert body == {
        "status": "unavailable",
        "error": "not served yet (a tokenizer and a worker each): b, c, d",
        "error_type": "Unhealthy",
        "tokenizers": ["a", "b", "c"],
        "workers": ["a", "d"],
        "waiting": ["b", "c", "d"],
    }
    assert health_answer(_view(["a", "b"], ["b", "a"]), Readiness((), True)) == (
        {"status": "ok", "models": ["a", "b"]},
        200,
    )
    body, status = health_answer(_view([], []), Readiness((), True))  # nothing announced is not ready either
    assert status == 503 and body["error"] == "no tokenizer answers" and body["waiting"] == []


def test_named_models_each_wait_for_their_tokenizer_and_worker():
    view = _view(["a", "b"], ["a"])
    body, status = health_answer(view, Readiness(("a", "b", "never"), False))
    assert status == 503 and body["waiting"] == ["b", "never"]
    assert health_answer(view, Readiness(("org/a",), False)) == (
        {"status": "ok", "models": ["a"]},
        200,
    )  # its last part
    body, status = health_answer(view, Readiness(("never",), True))
    assert body["waiting"] == ["never", "b"]
