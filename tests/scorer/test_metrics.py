"""The scorer's metrics: reranks and candidates counted and timed whether they succeed or fail, error
replies by code, reranks in flight read when scraped."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from embedfleet.services.scorer.metrics import ScorerMetrics
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.protocol import ErrorReply
from tests.support.prometheus_text import value


def test_reranks_candidates_errors_in_flight():
    busy = [3]
    metrics = ScorerMetrics("m", "bi-encoder", lambda: busy[0])
    with metrics.rerank(100):
        pass
    with pytest.raises(RuntimeError), metrics.rerank(7):
        raise RuntimeError("scoring failed")
    metrics.answered(ErrorReply("r", ErrorCode.TIMEOUT, "late"))
    metrics.answered(object())  # an answer, not an error
    text = generate_latest(metrics.registry).decode()
    assert value(text, "embedfleet_scorer_reranks_total", model="m", kind="bi-encoder") == 2
    assert value(text, "embedfleet_scorer_candidates_total", model="m") == 107
    assert value(text, "embedfleet_scorer_rerank_candidates_bucket", model="m", le="10.0") == 1
    assert value(text, "embedfleet_scorer_rerank_candidates_bucket", model="m", le="100.0") == 2
    assert value(text, "embedfleet_scorer_seconds_count", model="m") == 2
    assert value(text, "embedfleet_scorer_errors_total", model="m", code="timeout") == 1
    assert value(text, "embedfleet_scorer_in_flight", model="m") == 3
    busy[0] = 0
    assert value(generate_latest(metrics.registry).decode(), "embedfleet_scorer_in_flight", model="m") == 0
