"""A request's rows gathered over several attempts: rows of a re-sent subset land where they belong,
rows that come twice are kept once, the request completes exactly when every row is in, and the rows a
dead process took with it are known."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from embedfleet.shared.nats.embed_client import _Pending, _subset
from embedfleet.shared.protocol import EmbedRequest, EmbedResult, Held, ProtocolError

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


def test_a_dead_worker_loses_the_rows_it_held_and_those_no_worker_holds():
    async def run() -> None:
        request = EmbedRequest("r", "m", [f"t{i}" for i in range(10)], 1e12)
        pending = _Pending(request, asyncio.get_running_loop().create_future())
        pending.hold(Held("r", 0, 4, "w1"), None)
        pending.hold(Held("r", 4, 4, "w2"), None)  # rows 8 and 9: in a tokenizer, or on their way
        pending.add(result("r", 0, 10, rows_for([0, 1]), 4), None)  # w1 answered two of its rows
        assert pending.lose("worker", "w1")
        assert np.flatnonzero(pending.lost & ~pending.filled).tolist() == [2, 3, 8, 9]
        pending.lost[:] = False
        # a re-sent subset (rows 2, 3, 8, 9) held by w3: its rows map back to the request's
        pending.hold(Held("r-1", 0, 4, "w3"), np.array([2, 3, 8, 9]))
        assert not pending.lose("tokenizer", "t1")  # every missing row is held by a live worker
        assert pending.lose("worker", "w2")
        assert np.flatnonzero(pending.lost & ~pending.filled).tolist() == [4, 5, 6, 7]
        with pytest.raises(ProtocolError):
            pending.hold(Held("r-1", 2, 3, "w3"), np.array([2, 3, 8, 9]))  # rows 2..5 of an attempt of 4

    asyncio.run(run())


def test_a_subset_attempt_takes_its_rows_spans_along():
    """Rows sent again as an attempt of their own keep their own spans (late chunking's windows)."""
    from embedfleet.shared.protocol import EmbedOptions, Spans, decode, encode

    spans = Spans.of([[(0, 2)], [(0, 1), (1, 3)], [(0, 0)]], [2, 3, 0])
    request = EmbedRequest(
        "r", "m", ["a b", "c d e", ""], 1e12, EmbedOptions(output="spans", truncate=False), spans=spans
    )
    again = decode(encode(_subset(request, "r-1", np.array([1, 2]))))
    assert again.texts == ["c d e", ""] and again.spans.counts.tolist() == [2, 1]
    assert list(zip(again.spans.firsts.tolist(), again.spans.lasts.tolist())) == [(0, 1), (1, 3), (0, 0)]
    assert again.spans.tokens.tolist() == [3, 0]


def test_a_request_answered_in_one_result_completes_as_one_answered_in_parts():
    """The whole request in one result (a lone query's) is taken as it came: the same outcome as its rows in
    two results, writable, and no view of the message; a result that does not fit is refused as before."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        request = EmbedRequest("r", "m", [f"text {i}" for i in range(3)], 1e12)
        whole = _Pending(request, loop.create_future())
        answer = result("r", 0, 3, rows_for([0, 1, 2]), 12)
        whole.add(answer, None)
        parts = _Pending(request, loop.create_future())
        parts.add(result("r", 0, 3, rows_for([0]), 4), None)
        parts.add(result("r", 1, 3, rows_for([1, 2]), 8), None)
        one, two = whole.future.result(), parts.future.result()
        np.testing.assert_array_equal(one.vectors, two.vectors)
        assert (one.tokens, one.dim, one.form, one.ragged) == (two.tokens, two.dim, two.form, two.ragged)
        assert one.vectors.flags.writeable and not np.shares_memory(one.vectors, answer.array())
        misfit = _Pending(request, loop.create_future())
        with pytest.raises(ProtocolError):
            misfit.add(result("r", 0, 4, rows_for([0, 1, 2, 3]), 4), None)

    asyncio.run(run())
