"""Prometheus metrics of one gateway (its own registry, no process-global state): HTTP requests and
errors, tokens, per-stage seconds (overall and per model), requests in flight, and bulk-job health
(services/gateway/jobs/metrics.py).

An API key is named in them by an id, never by itself: the first 12 hex digits of its HMAC-SHA256
under a secret ($EMBEDFLEET_KEY_ID_SECRET; none: a random one per process, said in the log at start,
key by key). A plain digest of the key would let whoever reads /metrics (an open path) test guesses of
a key offline, and tell the same key across deployments.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from embedfleet.services.gateway.http.limits import NO_KEY
from embedfleet.services.gateway.jobs.metrics import JobMetrics

STAGES = ("queue", "tokenize", "inference", "total")
MODEL_STAGES = ("tokenize", "queue", "inference")  # the stages a request's result reports, per model
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def key_id(key: str | None, secret: bytes) -> str:
    """A key's name in metrics and logs: the first 12 hex digits of its HMAC-SHA256 under ``secret``
    (``printf %s KEY | openssl dgst -sha256 -hmac SECRET`` tells which key it is); no key: ``none``."""
    return hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()[:12] if key else NO_KEY


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, key_id_secret: str | None = None) -> None:
        # the secret of the keys' ids (module docstring); None: a random one, this process's alone
        self._key_secret = key_id_secret.encode() if key_id_secret else os.urandom(32)
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "embedfleet_requests",
            'HTTP requests by route and status (code "disconnected": the client went away before its answer)',
            ["route", "code"],
            registry=self.registry,
        )
        self.errors = Counter(
            "embedfleet_errors",
            "HTTP error answers (status >= 400) by route and status",
            ["route", "code"],
            registry=self.registry,
        )
        self.tokens = Counter("embedfleet_tokens", "tokens embedded, by model", ["model"], registry=self.registry)
        self.stage_seconds = Histogram(
            "embedfleet_stage_seconds", "seconds per request stage", ["stage"], buckets=_BUCKETS, registry=self.registry
        )
        self.in_flight = Gauge("embedfleet_requests_in_flight", "requests being handled", registry=self.registry)
        self.model_stage_seconds = Histogram(
            "embedfleet_model_stage_seconds",
            "seconds per request stage, by model (tokenize, queue, inference)",
            ["model", "stage"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.key_requests = Counter(
            "embedfleet_key_requests",
            "requests by API key (key: its id, an HMAC, see docs/security.md) and outcome: admitted or limited (over a "
            "per-key limit)",
            ["key", "outcome"],
            registry=self.registry,
        )
        self.key_tokens = Counter(
            "embedfleet_key_tokens", "tokens embedded by API key", ["key"], registry=self.registry
        )
        self.jobs = JobMetrics(self.registry)
        # (metric, label values) -> its child: prometheus_client's labels() checks and locks on every call,
        # a cost per request; the label values are few (routes, statuses, models, configured keys)
        self._children: dict[tuple[Any, ...], Any] = {}

    def child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, looked up once."""
        found = self._children.get((metric, *values))
        if found is None:
            found = self._children[(metric, *values)] = metric.labels(*values)
        return found

    def observe(self, route: str, status: int | str) -> None:
        """An answered request, or one whose client went away first (status "disconnected": no error)."""
        self.child(self.requests, route, str(status)).inc()
        if isinstance(status, int) and status >= 400:
            self.child(self.errors, route, str(status)).inc()

    def observe_stages(self, model: str, tokens: int, timings: dict[str, float]) -> None:
        self.child(self.tokens, model).inc(tokens)
        for stage, seconds in timings.items():
            if stage in STAGES:
                self.child(self.stage_seconds, stage).observe(seconds)
            if stage in MODEL_STAGES:
                self.child(self.model_stage_seconds, model, stage).observe(seconds)

    def key_request(self, key: str | None, outcome: str) -> None:
        """A request of API key ``key`` (None: none given) admitted or limited."""
        self.child(self.key_requests, self.key_name(key), outcome).inc()

    def key_tokens_of(self, key: str | None, tokens: int) -> None:
        """Tokens embedded for API key ``key`` (None: none given)."""
        self.child(self.key_tokens, self.key_name(key)).inc(tokens)

    def key_name(self, key: str | None) -> str:
        """``key_id(key)`` under this gateway's secret, computed once per key."""
        found = self._children.get(("key", key))
        if found is None:
            found = self._children[("key", key)] = key_id(key, self._key_secret)
        return found

    def render(self) -> bytes:
        return generate_latest(self.registry)
