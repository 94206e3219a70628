"""Admission control: at most --max-in-flight requests handled at once, more answered 429 at once
(never queued), as text-embeddings-inference's bounded semaphore does.

Every route takes a slot, from the moment its request is authenticated until its answer is sent, but
the probes: liveness and readiness, metrics and the API's description must answer an overloaded
gateway (a probe refused with 429 would have the gateway restarted for being busy).
"""

from __future__ import annotations

from prometheus_client import Gauge

# (method, path) of the requests that take no slot; HEAD is GET without the body
PROBES = frozenset(
    (method, path) for method in ("GET", "HEAD") for path in ("/health", "/ping", "/", "/metrics", "/openapi.json")
)


class Admission:
    """The slots of ``limit`` requests; ``gauge`` shows how many are taken."""

    def __init__(self, limit: int, gauge: Gauge) -> None:
        self.limit = limit
        self.taken = 0
        self._gauge = gauge

    @staticmethod
    def exempt(method: str, path: str) -> bool:
        return (method, path) in PROBES

    def enter(self) -> bool:
        """Take a slot; False (nothing taken) when all are."""
        if self.taken >= self.limit:
            return False
        self.taken += 1
        self._gauge.inc()
        return True

    def leave(self) -> None:
        self.taken -= 1
        self._gauge.dec()
