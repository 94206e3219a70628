"""Exact progress of a bulk job: which of its documents are accounted for (stored, or given up).

A document is row ``r`` of job batch ``b``. A stage records the rows it stored or gave up in the
job's state before it acknowledges their batch; a process killed in between leaves the batch to be
delivered again, and recording the same rows a second time changes nothing. So ``done`` and
``failed`` count each document once, whichever process dies at whichever point.

The ``Ledger`` is the job state's ``accounted`` and stays small: job batches wholly accounted for are
merged into index ranges (``whole``), and only the batches in flight keep row ranges (``part``); all
ranges half-open, sorted, disjoint. Stored as ``{"whole": [[b0, b1], ...], "part": {"<b>": [[r0, r1], ...]}}``
(shared/jobs/state.py).

A chunked job keeps two more ledgers of that shape (shared/jobs/chunk_progress.py): its chunk rows
(``accounted_chunks``: row r of job batch b is a chunk, not a document) and the job batches whose
chunks were counted (``cut``); ``accounted`` stays its documents'.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

Span = tuple[int, int]  # [lo, hi)


class Rows(NamedTuple):
    """Rows [start, start + count) of job batch ``batch``, a batch of ``total`` documents (0: not known)."""

    batch: int
    start: int
    count: int  # type: ignore[assignment]  # the rows, a field: it hides tuple.count, which no one calls on it
    total: int = 0


@dataclass(frozen=True, slots=True)
class Ledger:
    """Rows accounted for: the job batches ``whole``, and per batch in flight its row ranges (``part``).
    A value: ``account`` gives a new ledger, this one is never changed."""

    whole: tuple[Span, ...] = ()
    part: Mapping[int, tuple[Span, ...]] = field(default_factory=dict)

    def account(self, rows: Rows) -> tuple[Ledger, int]:
        """This ledger with ``rows`` accounted for, and how many of them were not before."""
        batch, start, count, total = rows
        if batch < 0 or start < 0 or count <= 0:
            return self, 0
        end = start + count
        if total and end > total:  # a batch that contradicts itself: its rows still count once
            total = 0
        if _holds(self.whole, batch):
            return self, 0
        spans = self.part.get(batch, ())
        fresh = count - _overlap(spans, start, end)
        if fresh == 0:
            return self, 0
        spans = _add(spans, start, end)
        part = dict(self.part)
        if total and spans == ((0, total),):
            part.pop(batch, None)
            return Ledger(_add(self.whole, batch, batch + 1), part), fresh
        part[batch] = spans
        return Ledger(self.whole, part), fresh

    def accounted(self, rows: Rows) -> int:
        """How many of ``rows`` this ledger holds as accounted for already."""
        batch, start, count, _ = rows
        if count <= 0 or _holds(self.whole, batch):
            return max(count, 0)
        return _overlap(self.part.get(batch, ()), start, start + count)


def _holds(spans: tuple[Span, ...], x: int) -> bool:
    return any(lo <= x < hi for lo, hi in spans)


def _overlap(spans: tuple[Span, ...], lo: int, hi: int) -> int:
    return sum(max(0, min(hi, b) - max(lo, a)) for a, b in spans)


def _add(spans: tuple[Span, ...], lo: int, hi: int) -> tuple[Span, ...]:
    """``spans`` with [lo, hi) added, touching ranges merged."""
    merged: list[list[int]] = []
    for a, b in sorted([*spans, (lo, hi)]):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return tuple((a, b) for a, b in merged)
