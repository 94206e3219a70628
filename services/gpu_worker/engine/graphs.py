"""Whole-model CUDA graphs: token-count buckets and lazy capture.

A batch of T tokens runs in the smallest bucket >= T (multiples of 64 up to 1024, then of 256 up
to the token budget); batches above the largest bucket run eagerly. The first batch in a bucket
runs eagerly (which also warms the kernels up), then the bucket is captured; later batches replay.
The capture itself is injected (``capture``), so the bookkeeping is testable without a GPU.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

Replay = Callable[[], None]


def bucket_sizes(max_tokens: int) -> list[int]:
    sizes = list(range(64, min(max_tokens, 1024) + 64, 64))
    size = 1024
    while size < max_tokens:
        size += 256
        sizes.append(size)
    return sizes


class GraphCache:
    def __init__(self, buckets: list[int], capture: Callable[[int], Replay]) -> None:
        self.buckets = sorted(buckets)
        self._capture = capture
        self._graphs: dict[int, Replay] = {}
        self.captures = 0
        self.replays = 0

    def bucket_for(self, tokens: int) -> int | None:
        """The smallest bucket holding ``tokens``; None above the largest (eager fallback)."""
        i = bisect.bisect_left(self.buckets, tokens)
        return self.buckets[i] if i < len(self.buckets) else None

    def run(self, bucket: int, eager: Callable[[], None]) -> str:
        """Replay the bucket's graph, or run eagerly and capture it: returns 'replay' or 'captured'."""
        replay = self._graphs.get(bucket)
        if replay is not None:
            replay()
            self.replays += 1
            return "replay"
        eager()
        self._graphs[bucket] = self._capture(bucket)
        self.captures += 1
        return "captured"
