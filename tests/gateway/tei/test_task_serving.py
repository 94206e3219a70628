"""/predict's work (services/gateway/tei/task_serving.py) against a classifier that answers in-process: single
texts and pairs go as two requests, each with its rows in the request; the logits come back in the request's
order and each outcome is accounted; a model that is no classifier is refused before any work."""

from __future__ import annotations

import asyncio

import numpy as np
import orjson
import pytest

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Limits
from embedfleet.services.gateway.tei import task_serving
from embedfleet.services.gateway.tei.tasks import parse_predict
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.nats.embed_client import EmbedOutcome
from embedfleet.shared.nats.fleet import FleetView

LABELS = ["neg", "pos"]
LIMITS = Limits(8, 100)


def _logits(text: str) -> list[float]:
    """A text's logits, [0, len]: the longer the text, the more "pos"."""
    return [0.0, float(len(text))]


class _Classifier:
    def __init__(self, task: str = "score") -> None:
        worker = {"task": task, "dim": str(len(LABELS)), "labels": orjson.dumps(LABELS).decode()}
        self._view = FleetView({"nli": {}}, {"nli": worker}, 0.0)
        self.asked: list[tuple[list[str], list | None, list[int]]] = []
        self.accounted: list[int] = []

    async def view(self) -> FleetView:
        return self._view

    async def classify(self, model, texts, pairs, options, rows) -> EmbedOutcome:
        self.asked.append((texts, pairs, rows))
        inputs = texts if pairs is None else [a + b for a, b in pairs]
        vectors = np.array([_logits(x) for x in inputs], dtype=np.float32)
        return EmbedOutcome(vectors, tokens=len(inputs), timings={"inference": 0.001 * len(inputs)})

    def account(self, model: str, outcome: EmbedOutcome) -> None:
        self.accounted.append(outcome.tokens)

    def stage_headers(self, outcome: EmbedOutcome) -> dict[str, str]:
        return {"x-inference-time": str(round(outcome.timings["inference"] * 1000))}


def test_singles_and_pairs_scored_apart_answered_in_order():
    fleet = _Classifier()
    call = parse_predict(orjson.dumps({"inputs": [["ab"], ["a", "bcd"], ["abc"]], "raw_scores": True}), LIMITS)
    response = asyncio.run(task_serving.predict(fleet, call, "nli"))
    assert fleet.asked == [(["ab", "abc"], None, [0, 2]), ([], [("a", "bcd")], [1])]
    assert sorted(fleet.accounted) == [1, 2]
    answer = orjson.loads(response.body)
    assert [row[0] for row in answer] == [
        {"score": 2.0, "label": "pos"},
        {"score": 4.0, "label": "pos"},  # the pair's: "a" + "bcd"
        {"score": 3.0, "label": "pos"},
    ]
    assert response.headers["x-inference-time"] == "2"  # the slower of the two requests'


def test_an_embedder_is_refused_before_any_work():
    fleet = _Classifier(task="embed")
    call = parse_predict(orjson.dumps({"inputs": "a"}), LIMITS)
    with pytest.raises(ApiError) as err:
        asyncio.run(task_serving.predict(fleet, call, "nli"))
    assert err.value.code is ErrorCode.INVALID_REQUEST and err.value.param == "model"
    assert fleet.asked == []
