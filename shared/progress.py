"""Exact progress of a bulk job: which of its documents are accounted for (stored, or given up).

A document is row ``r`` of job batch ``b``. A stage records the rows it stored or gave up in the
job's state before it acknowledges their batch; a process killed in between leaves the batch to be
delivered again, and recording the same rows a second time changes nothing. So ``done`` and
``failed`` count each document once, whichever process dies at whichever point.

The ledger lives in the job's JSON state under ``accounted`` and stays small: job batches wholly
accounted for are merged into index ranges, and only the batches in flight keep row ranges:
``{"whole": [[b0, b1], ...], "part": {"<b>": [[r0, r1], ...]}}`` (half-open ranges, sorted, disjoint).

A chunked job keeps two more ledgers of that shape (shared/chunk_progress.py): its chunk rows
(``CHUNK_LEDGER``: row r of job batch b is a chunk, not a document) and the job batches whose chunks
were counted (``CUT_LEDGER``); ``accounted`` stays its documents'.
"""

from __future__ import annotations

from typing import NamedTuple

LEDGER = "accounted"
CHUNK_LEDGER = "accounted_chunks"
CUT_LEDGER = "cut"
LEDGERS = (LEDGER, CHUNK_LEDGER, CUT_LEDGER)  # a state's bookkeeping, not shown to users


class Rows(NamedTuple):
    """Rows [start, start + count) of job batch ``batch``, a batch of ``total`` documents (0: not known)."""

    batch: int
    start: int
    count: int  # type: ignore[assignment]  # the rows, a field: it hides tuple.count, which no one calls on it
    total: int = 0


def account(state: dict, rows: Rows, ledger: str = LEDGER) -> int:
    """Record ``rows`` as accounted for in ``state``'s ``ledger``; returns how many of them were not before."""
    batch, start, count, total = rows
    if batch < 0 or start < 0 or count <= 0:
        return 0
    end = start + count
    if total and end > total:  # a batch that contradicts itself: its rows still count once
        total = 0
    book = state.setdefault(ledger, {"whole": [], "part": {}})
    if _holds(book["whole"], batch):
        return 0
    key = str(batch)
    spans = book["part"].get(key, [])
    fresh = count - _overlap(spans, start, end)
    if fresh == 0:
        return 0
    spans = _add(spans, start, end)
    if total and spans == [[0, total]]:
        book["part"].pop(key, None)
        book["whole"] = _add(book["whole"], batch, batch + 1)
    else:
        book["part"][key] = spans
    return fresh


def accounted(state: dict, rows: Rows, ledger: str = LEDGER) -> int:
    """How many of ``rows`` ``state``'s ``ledger`` holds as accounted for already (nothing recorded)."""
    batch, start, count, _ = rows
    book = state.get(ledger) or {"whole": [], "part": {}}
    if count <= 0 or _holds(book["whole"], batch):
        return max(count, 0)
    return _overlap(book["part"].get(str(batch), []), start, start + count)


def _holds(spans: list[list[int]], x: int) -> bool:
    return any(lo <= x < hi for lo, hi in spans)


def _overlap(spans: list[list[int]], lo: int, hi: int) -> int:
    return sum(max(0, min(hi, b) - max(lo, a)) for a, b in spans)


def _add(spans: list[list[int]], lo: int, hi: int) -> list[list[int]]:
    """``spans`` with [lo, hi) added, touching ranges merged."""
    merged: list[list[int]] = []
    for a, b in sorted([*spans, [lo, hi]]):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged
