"""A request's rows gathered over several attempts: rows of a re-sent subset land where they belong,
rows that come twice are kept once, and the request completes exactly when every row is in."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from shared.client import _Pending, _subset
from shared.protocol import EmbedRequest, EmbedResult, ProtocolError

DIM = 4


def result(attempt: str, start: int, total: int, rows: np.ndarray, tokens: int) -> EmbedResult:
    return EmbedResult(attempt, start, total, DIM, "f4", rows.astype("<f4").tobytes(), tokens)


def rows_for(indices: list[int]) -> np.ndarray:
    return np.array([[i, i + 0.5, -i, 1.0] for i in indices], np.float32)


def test_subset_attempt_rows_map_back_and_duplicates_are_ignored():
    async def run() -> None:
        request = EmbedRequest("r", "m", [f"text {i}" for i in range(6)], 1e12)
        pending = _Pending(request, asyncio.get_running_loop().create_future())
        pending.add(result("r", 0, 6, rows_for([0, 1]), 10), None)
        missing = pending.missing()
        assert missing.tolist() == [2, 3, 4, 5]
        again = _subset(request, "r-1", missing)
        assert again.id == "r-1" and again.texts == ["text 2", "text 3", "text 4", "text 5"]
        # the re-sent subset's first chunk: its rows 0..2 are the request's rows 2 and 3
        pending.add(result("r-1", 0, 4, rows_for([2, 3]), 8), missing)
        # a late chunk of the first attempt overlaps: only row 4 is new, its tokens counted pro rata
        pending.add(result("r", 3, 6, rows_for([3, 4]), 6), None)
        assert not pending.future.done()
        pending.add(result("r-1", 2, 4, rows_for([4, 5]), 8), missing)  # row 4 again, row 5 new
        outcome = pending.future.result()
        np.testing.assert_array_equal(outcome.vectors, rows_for(list(range(6))))
        assert outcome.tokens == 10 + 8 + 3 + 4

    asyncio.run(run())


def test_rows_outside_the_attempt_are_refused():
    async def run() -> None:
        request = EmbedRequest("r", "m", ["a", "b", "c"], 1e12)
        pending = _Pending(request, asyncio.get_running_loop().create_future())
        with pytest.raises(ProtocolError):
            pending.add(result("r-1", 1, 2, rows_for([0, 1]), 2), np.array([1, 2]))  # rows 1..3 of 2
        with pytest.raises(ProtocolError):
            pending.add(result("r", 0, 4, rows_for([0]), 1), None)  # the request has 3 rows, not 4

    asyncio.run(run())
