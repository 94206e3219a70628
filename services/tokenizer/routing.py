"""Load-aware routing: send each token batch to the least-loaded live worker. No NATS here.

Workers report the tokens waiting on them every few tens of milliseconds. Between two reports the
router adds the tokens it has itself sent to a worker since its last report, so a burst of chunks
spreads over the workers instead of piling onto the one that looked idle. A worker is live while
its reports keep coming (three intervals of silence and it is dropped; a leaving report drops it
at once). With no live worker known, the caller falls back to the shared queue group.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.protocol import LoadReport

STALE_INTERVALS = 3.0


@dataclass(slots=True)
class _Worker:
    subject: str
    reported: int  # tokens waiting, as last reported
    sent: int  # tokens sent to it since that report
    seen: float  # time of the last report
    interval: float


class Router:
    def __init__(self) -> None:
        self._workers: dict[str, _Worker] = {}

    def update(self, report: LoadReport, now: float) -> None:
        if report.leaving:
            self._workers.pop(report.id, None)
            return
        self._workers[report.id] = _Worker(report.subject, report.queued_tokens, 0, now, report.interval)

    def live(self, now: float) -> list[str]:
        return sorted(wid for wid, w in self._workers.items() if now - w.seen <= STALE_INTERVALS * w.interval)

    def pick(self, tokens: int, now: float) -> str | None:
        """The subject of the least-loaded live worker (None: none known), charged with ``tokens``."""
        best: _Worker | None = None
        for wid in list(self._workers):
            w = self._workers[wid]
            if now - w.seen > STALE_INTERVALS * w.interval:
                del self._workers[wid]  # silent too long: gone
                continue
            if best is None or w.reported + w.sent < best.reported + best.sent:
                best = w
        if best is None:
            return None
        best.sent += tokens
        return best.subject
