"""Prometheus metrics of one scorer (its own registry, no process-global state): reranks, candidates,
seconds, reranks in flight, errors by code."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from embedfleet.shared.protocol import ErrorReply

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_CANDIDATES = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0)


class ScorerMetrics:
    def __init__(self, model: str, kind: str, in_flight: Callable[[], int]) -> None:
        """``kind``: cross-encoder or bi-encoder; ``in_flight``: the reranks being scored now."""
        self.registry = r = CollectorRegistry()
        self._model = model
        self._reranks = Counter(
            "embedfleet_scorer_reranks",
            "rerank requests scored (answered or failed), by kind (cross-encoder or bi-encoder)",
            ["model", "kind"],
            registry=r,
        ).labels(model, kind)
        self._candidates = Counter("embedfleet_scorer_candidates", "candidates scored", ["model"], registry=r).labels(
            model
        )
        self._per_rerank = Histogram(
            "embedfleet_scorer_rerank_candidates", "candidates per rerank", ["model"], buckets=_CANDIDATES, registry=r
        ).labels(model)
        self._seconds = Histogram(
            "embedfleet_scorer_seconds",
            "seconds scoring one rerank (its embeddings or pair scores through the fleet included)",
            ["model"],
            buckets=_SECONDS,
            registry=r,
        ).labels(model)
        self._errors = Counter("embedfleet_scorer_errors", "error replies by code", ["model", "code"], registry=r)
        Gauge("embedfleet_scorer_in_flight", "reranks being scored", ["model"], registry=r).labels(model).set_function(
            in_flight
        )

    @contextlib.contextmanager
    def rerank(self, candidates: int) -> Iterator[None]:
        """Count and time one rerank of ``candidates`` candidates, whether it succeeds or fails."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._reranks.inc()
            self._candidates.inc(candidates)
            self._per_rerank.observe(candidates)
            self._seconds.observe(time.perf_counter() - start)

    def answered(self, reply: object) -> None:
        if isinstance(reply, ErrorReply):
            self._errors.labels(self._model, reply.code.value).inc()
