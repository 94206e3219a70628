"""Load-aware routing: send each token batch to the live worker that will finish it first. No NATS here.

Workers report the tokens waiting on them and their recent speed (tokens/s) every few tens of
milliseconds while busy, every other second while idle. A batch goes where (waiting + sent since
the report + this batch) / speed is least: the least-loaded worker among equals, and a slower
(busier, older, shared) worker only once the faster one's queue outweighs the difference. Tokens the
router itself sent since a worker's last report count as waiting, so a burst spreads instead of
piling onto the one that looked idle. A worker is live while its reports keep coming: silent for
three of the intervals its last report announced, it is dropped (a leaving report drops it at once, and
so does a batch sent to it that reached nobody: its process is gone). A request may name workers its
requester took for stopped (silent with their connections open, their reports not stale here yet): its
batches pass them over, to the shared queue group when no other worker is known.
With no live worker known, the caller uses the shared queue group.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from embedfleet.shared.protocol import LoadReport

STALE_INTERVALS = 3.0


@dataclass(slots=True)
class _Worker:
    subject: str
    reported: int  # tokens waiting, as last reported
    sent: int  # tokens sent to it since that report
    seen: float  # time of the last report
    interval: float
    rate: float  # tokens/s; 0 until measured

    def finish_time(self, tokens: int, default_rate: float) -> float:
        return (self.reported + self.sent + tokens) / (self.rate or default_rate)


class Router:
    def __init__(self) -> None:
        self._workers: dict[str, _Worker] = {}

    def update(self, report: LoadReport, now: float) -> None:
        if report.leaving:
            self._workers.pop(report.id, None)
            return
        self._workers[report.id] = _Worker(report.subject, report.queued_tokens, 0, now, report.interval, report.rate)

    def forget(self, subject: str) -> None:
        """The worker on ``subject`` is gone (a batch sent there reached nobody)."""
        for wid in [wid for wid, w in self._workers.items() if w.subject == subject]:
            del self._workers[wid]

    def live(self, now: float) -> list[str]:
        return sorted(wid for wid, w in self._workers.items() if now - w.seen <= STALE_INTERVALS * w.interval)

    def pick(self, tokens: int, now: float, avoid: tuple[str, ...] = ()) -> str | None:
        """The subject of the live worker that would finish ``tokens`` first, passing over the workers ``avoid``
        names (their ids) (None: none known, or only those)."""
        for wid in [wid for wid, w in self._workers.items() if now - w.seen > STALE_INTERVALS * w.interval]:
            del self._workers[wid]  # silent too long: gone
        if not self._workers:
            return None
        # a worker that has not measured its speed yet is taken to be as fast as the fastest known
        default_rate = max((w.rate for w in self._workers.values()), default=0.0) or 1.0
        workers: Collection[_Worker] = self._workers.values()
        if avoid:
            workers = [w for wid, w in self._workers.items() if wid not in avoid]
            if not workers:  # every worker known is one to pass over: the queue group may hold one not known yet
                return None
        best = min(workers, key=lambda w: w.finish_time(tokens, default_rate))
        best.sent += tokens
        return best.subject
