"""When a worker sends its load report to the tokenizers. No NATS here.

While work waits or runs on the worker, a report every ``busy`` seconds: the tokenizers route each
batch by these figures, and a busy worker that dies must drop out of their routing within
milliseconds. While nothing waits, a report every ``idle`` seconds: an idle fleet's tokenizers,
workers and NATS servers then handle a fraction of the messages (40x fewer at the defaults). A change
is never held back: a worker that gets work, or runs out of it, reports at its next ``busy`` tick (work
that came and went between two ticks is no change: a lone query answered within a tick costs no report,
the tokenizer that routed it counting its tokens meanwhile).
Each report names the longest wait until the next, which the tokenizers' staleness check reads. An
idle worker sleeps until work arrives or its next report is due: it wakes every other second, not
at every ``busy`` tick.
"""

from __future__ import annotations


class ReportCadence:
    def __init__(self, busy: float, idle: float) -> None:
        # idle >= busy: WorkerConfig refuses less (--load-idle-interval)
        self.busy = busy  # the tick while busy: the caller asks every `busy` seconds
        self.idle = idle
        self._sent_at: float | None = None
        self._sent_load: int | None = None

    def due(self, load: int, now: float) -> float | None:
        """The interval to announce when a report of ``load`` queued tokens is due at ``now``, else None."""
        idle = load == 0
        if idle and self._sent_load == 0 and self._sent_at is not None and now - self._sent_at < self.idle:
            return None
        self._sent_at, self._sent_load = now, load
        return self.idle if idle else self.busy

    def wait(self, load: int, now: float) -> float:
        """Seconds until the next tick: ``busy`` while work waits, else until the next idle report is
        due (the caller wakes sooner when work arrives)."""
        if load or self._sent_at is None:
            return self.busy
        return max(0.0, self._sent_at + self.idle - now)
