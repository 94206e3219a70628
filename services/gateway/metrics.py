"""Prometheus metrics of one gateway (its own registry, no process-global state): HTTP requests and
errors, tokens, per-stage seconds (overall and per model), requests in flight, and bulk-job health
(services/gateway/job_metrics.py)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from services.gateway.job_metrics import JobMetrics

STAGES = ("queue", "tokenize", "inference", "total")
MODEL_STAGES = ("tokenize", "queue", "inference")  # the stages a request's result reports, per model
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "embedfleet_requests", "HTTP requests by route and status (code \"disconnected\": the client went away before its answer)", ["route", "code"], registry=self.registry
        )
        self.errors = Counter(
            "embedfleet_errors", "HTTP error answers (status >= 400) by route and status", ["route", "code"],
            registry=self.registry,
        )
        self.tokens = Counter("embedfleet_tokens", "tokens embedded, by model", ["model"], registry=self.registry)
        self.stage_seconds = Histogram(
            "embedfleet_stage_seconds", "seconds per request stage", ["stage"], buckets=_BUCKETS, registry=self.registry
        )
        self.in_flight = Gauge("embedfleet_requests_in_flight", "requests being handled", registry=self.registry)
        self.model_stage_seconds = Histogram(
            "embedfleet_model_stage_seconds", "seconds per request stage, by model (tokenize, queue, inference)",
            ["model", "stage"], buckets=_BUCKETS, registry=self.registry,
        )
        self.key_requests = Counter(
            "embedfleet_key_requests", "requests by API key (key: its id, see README) and outcome: admitted or "
            "limited (over a per-key limit)", ["key", "outcome"], registry=self.registry,
        )
        self.key_tokens = Counter("embedfleet_key_tokens", "tokens embedded by API key", ["key"], registry=self.registry)
        self.jobs = JobMetrics(self.registry)

    def observe(self, route: str, status: int | str) -> None:
        """An answered request, or one whose client went away first (status "disconnected": no error)."""
        self.requests.labels(route, str(status)).inc()
        if isinstance(status, int) and status >= 400:
            self.errors.labels(route, str(status)).inc()

    def observe_stages(self, model: str, tokens: int, timings: dict[str, float]) -> None:
        self.tokens.labels(model).inc(tokens)
        for stage in STAGES:
            if stage in timings:
                self.stage_seconds.labels(stage).observe(timings[stage])
        for stage in MODEL_STAGES:
            if stage in timings:
                self.model_stage_seconds.labels(model, stage).observe(timings[stage])

    def render(self) -> bytes:
        return generate_latest(self.registry)
