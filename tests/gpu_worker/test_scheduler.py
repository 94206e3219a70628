from dataclasses import replace

import numpy as np
import pytest

from embedfleet.services.gpu_worker.scheduler import Scheduler, Work
from embedfleet.shared.protocol import EmbedOptions, TokenChunk


def _work(
    request_id: str,
    lengths: list[int],
    deadline: float = 1e12,
    start: int = 0,
    prompt_tokens: int = 0,
    task: str | None = None,
) -> Work:
    cu = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=cu[1:])
    ids = np.arange(cu[-1], dtype=np.int32)
    batch = TokenChunk(
        request_id,
        "m",
        start,
        start + len(lengths),
        ids,
        cu,
        deadline,
        EmbedOptions(task=task),
        prompt_tokens=prompt_tokens,
    )
    return Work(batch, reply=f"inbox.{request_id}")


def _rows(batch):
    return [(s.work.batch.id, s.row_start, s.row_end) for s in batch.slices]


def test_fcfs_under_token_budget():
    s = Scheduler(max_tokens=10, max_seqs=100)
    s.push(_work("a", [4, 4]))
    s.push(_work("b", [3, 3]))
    assert s.queued_tokens == 14
    b1 = s.next_batch()
    assert _rows(b1) == [("a", 0, 2)]  # 8 tokens; b's first row (3) would exceed 10
    assert b1.num_tokens == 8 and b1.cu_seqlens.tolist() == [0, 4, 8]
    b2 = s.next_batch()
    assert _rows(b2) == [("b", 0, 2)]
    assert s.next_batch() is None and s.queued_tokens == 0 and len(s) == 0


def test_batches_span_works_and_split_them():
    s = Scheduler(max_tokens=10, max_seqs=100)
    s.push(_work("a", [3]))
    s.push(_work("b", [3, 3, 3]))
    b1 = s.next_batch()
    assert _rows(b1) == [("a", 0, 1), ("b", 0, 2)]
    # token ids are taken from the right places in each work
    assert b1.input_ids.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 5]
    assert _rows(s.next_batch()) == [("b", 2, 3)]


def test_prompt_tokens_become_a_skip_per_row():
    """Works with different prompts share a batch: each row keeps its own request's prompt length."""
    s = Scheduler(max_tokens=100, max_seqs=100)
    s.push(_work("plain", [3, 3]))
    assert s.next_batch().skip is None  # no work skips anything: the engine is told nothing
    s.push(_work("query", [6, 7], prompt_tokens=4))
    s.push(_work("plain", [3]))
    s.push(_work("doc", [5], prompt_tokens=2))
    assert s.next_batch().skip.tolist() == [4, 4, 0, 2]


def test_each_row_runs_with_its_requests_task_adapter():
    """Requests of different tasks share a batch: each row carries its own adapter (numbered from 1 as
    the model lists them), rows of requests without a task none (0)."""
    s = Scheduler(max_tokens=100, max_seqs=100, adapters=("retrieval.query", "retrieval.passage", "text-matching"))
    s.push(_work("plain", [3, 3]))
    assert s.next_batch().adapters is None  # no work names a task: the engine is told nothing
    s.push(_work("q", [4, 2], task="retrieval.query"))
    s.push(_work("plain", [3]))
    s.push(_work("d", [5], task="retrieval.passage"))
    s.push(_work("m", [2, 2], task="text-matching"))
    assert s.next_batch().adapters.tolist() == [1, 1, 0, 2, 3, 3]


def test_sequence_cap():
    s = Scheduler(max_tokens=1000, max_seqs=3)
    s.push(_work("a", [1, 1]))
    s.push(_work("b", [1, 1]))
    assert _rows(s.next_batch()) == [("a", 0, 2), ("b", 0, 1)]
    assert _rows(s.next_batch()) == [("b", 1, 2)]


def test_sequence_over_budget_runs_alone():
    s = Scheduler(max_tokens=4, max_seqs=10)
    s.push(_work("a", [9, 1]))
    assert _rows(s.next_batch()) == [("a", 0, 1)]
    assert _rows(s.next_batch()) == [("a", 1, 2)]


def test_complete_fills_rows_and_reports_finished_works():
    s = Scheduler(max_tokens=5, max_seqs=10)
    a, b = _work("a", [2, 2, 2]), _work("b", [1])
    s.push(a)
    s.push(b)
    b1 = s.next_batch()  # a rows 0..2
    assert s.complete(b1, np.array([[1.0], [2.0]], np.float32)) == []
    b2 = s.next_batch()  # a row 2, b row 0
    done = s.complete(b2, np.array([[3.0], [4.0]], np.float32))
    assert done == [a, b]
    assert a.vectors.ravel().tolist() == [1.0, 2.0, 3.0]
    assert b.vectors.ravel().tolist() == [4.0]


def test_expired_work_is_dropped_before_compute_and_started_work_runs_no_further():
    s = Scheduler(max_tokens=2, max_seqs=10)
    started, late, fresh = _work("s", [2, 2], deadline=10), _work("l", [1], deadline=10), _work("f", [1], deadline=100)
    s.push(started)
    s.push(late)
    s.push(fresh)
    running = s.next_batch()  # starts "s"
    assert s.drop_expired(now=50) == [started, late]
    assert (started.rows_left, late.rows_left) == (1, 1)
    assert s.queued_tokens == 1
    assert _rows(s.next_batch()) == [("f", 0, 1)]
    assert s.next_batch() is None
    # the rows already running finish, and the dropped work is not complete with them
    assert Scheduler.complete(running, np.ones((1, 2), np.float32)) == []


def test_a_huge_batch_runs_no_batch_past_its_deadline():
    s = Scheduler(max_tokens=1000, max_seqs=4)
    huge, online = _work("huge", [1] * 100_000, deadline=10), _work("o", [3], deadline=100)
    s.push(huge)
    s.push(online)
    for _ in range(3):
        assert _rows(s.next_batch())[0][0] == "huge"
    assert s.drop_expired(now=11) == [huge]
    assert huge.rows_left == 100_000 - 12
    assert _rows(s.next_batch()) == [("o", 0, 1)]
    assert s.queued_tokens == 0


def _keyed(request_id: str, lengths: list[int], key: bytes | None) -> Work:
    work = _work(request_id, lengths)
    work.batch = replace(work.batch, cancel_key=key)
    return work


def test_cancel_drops_the_queued_rows_of_the_works_with_its_key():
    s = Scheduler(max_tokens=4, max_seqs=10)
    key, other = b"k" * 16, b"o" * 16
    first, second, theirs, plain = (
        _keyed("a", [2, 2, 2], key),
        _keyed("a-1", [3], key),  # the same request sent again: the same key
        _keyed("b", [1], other),
        _keyed("c", [1], None),
    )
    for work in (first, second, theirs, plain):
        s.push(work)
    s.push(_keyed("bulk", [1], key), bulk=True)  # bulk work is never cancelled this way
    running = s.next_batch()
    assert _rows(running) == [("a", 0, 2)]
    assert s.cancel(b"x" * 16) == []  # a key nobody holds: nothing
    assert s.cancel(key) == [first, second]
    assert (first.rows_left, second.rows_left) == (1, 1)
    assert s.queued_tokens == 3
    assert [r[0] for r in _rows(s.next_batch())] == ["b", "c"]
    assert _rows(s.next_batch()) == [("bulk", 0, 1)]
    assert Scheduler.complete(running, np.ones((2, 2), np.float32)) == []  # never answered


def test_online_before_bulk():
    s = Scheduler(max_tokens=100, max_seqs=100)
    s.push(_work("bulk", [5]), bulk=True)
    s.push(_work("online", [5]))
    assert _rows(s.next_batch()) == [("online", 0, 1)]
    assert _rows(s.next_batch()) == [("bulk", 0, 1)]


def test_bulk_batches_have_their_own_smaller_budget():
    s = Scheduler(max_tokens=12, max_seqs=100, bulk_tokens=6)
    s.push(_work("bulk", [3, 3, 3, 3]), bulk=True)
    s.push(_work("online", [4, 4, 4]))
    assert _rows(s.next_batch()) == [("online", 0, 3)]  # 12 tokens: the full budget
    assert _rows(s.next_batch()) == [("bulk", 0, 2)]  # 6 tokens
    assert _rows(s.next_batch()) == [("bulk", 2, 4)]
    assert Scheduler(8, 100, bulk_tokens=64).bulk_tokens == 8  # never above the budget


def test_rejects_bad_budgets():
    with pytest.raises(ValueError):
        Scheduler(0, 1)


def test_withdraw_bulk_takes_back_only_work_not_started():
    s = Scheduler(max_tokens=10, max_seqs=100)
    online, started, waiting = _work("q", [2]), _work("b1", [6, 6]), _work("b2", [3])
    s.push(online)
    s.push(started, bulk=True)
    s.push(waiting, bulk=True)
    s.next_batch()  # the online query
    assert _rows(s.next_batch()) == [("b1", 0, 1)]  # b1 started: its second row waits
    assert s.withdraw_bulk() == [waiting]
    assert s.queued_tokens == 6 and s.bulk_waiting == 1
    assert _rows(s.next_batch()) == [("b1", 1, 2)]  # what started is finished
    assert s.next_batch() is None and s.withdraw_bulk() == []


def test_spans_follow_their_rows_across_batches_and_other_works():
    """A spans work split over batches, beside a dense work: each batch carries its rows' spans (none for
    the dense rows), and each span's vector lands at its place in the work, whatever batch made it."""
    from embedfleet.shared.protocol import EmbedOptions, Spans

    lengths, rows = [4, 6, 5], [[(1, 3)], [(0, 2), (1, 6), (5, 6)], [(2, 4), (0, 5)]]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    spans = Spans.of(rows)
    chunk = TokenChunk(
        "late",
        "m",
        0,
        3,
        np.arange(cu[-1], dtype=np.int32),
        cu,
        1e12,
        EmbedOptions(output="spans", truncate=False),
        spans=spans,
    )
    s = Scheduler(max_tokens=10, max_seqs=100)
    s.push(_work("plain", [3]))
    s.push(Work(chunk, reply="inbox.late"))
    finished = []
    while (batch := s.next_batch()) is not None:
        assert batch.outputs == ("dense", "spans") or "plain" not in {x.work.batch.id for x in batch.slices}
        starts = np.repeat(batch.cu_seqlens[:-1], batch.spans.counts)
        # the engine's stand-in: a span's "vector" is (its first token's id, its length)
        made = np.stack([batch.input_ids[starts + batch.spans.firsts], batch.spans.lasts - batch.spans.firsts], 1)
        finished += Scheduler.complete(
            batch, {"spans": made.astype(np.float32), "dense": np.zeros((len(batch.cu_seqlens) - 1, 2), np.float32)}
        )
    late = next(w for w in finished if w.batch.id == "late")
    want = [(cu[i] + a, b - a) for i, row in enumerate(rows) for a, b in row]
    assert late.vectors.tolist() == [[float(x), float(n)] for x, n in want]


def _images(request_id: str, count: int, tokens: int = 17) -> Work:
    pixels = np.full((count, 3, 4, 4), len(request_id), np.uint8)
    cu = (np.arange(count + 1) * tokens).astype(np.int32)
    batch = TokenChunk(request_id, "m", 0, count, np.zeros(0, np.int32), cu, 1e12, pixels=pixels)
    return Work(batch, reply=f"inbox.{request_id}")


def test_images_and_token_rows_never_share_a_batch():
    """Each runs through its own tower: a batch closes where the kind of the next queued work changes;
    images count their tower's tokens against the budget."""
    s = Scheduler(max_tokens=40, max_seqs=100)
    for work in (_work("t1", [3, 3]), _images("i1", 3), _images("ii2", 1), _work("t2", [2])):
        s.push(work)
    first = s.next_batch()
    assert _rows(first) == [("t1", 0, 2)] and first.pixels is None
    second = s.next_batch()  # 2 images of 17 tokens fit 40; the third waits
    assert _rows(second) == [("i1", 0, 2)] and second.pixels.shape == (2, 3, 4, 4)
    assert second.num_tokens == 34 and len(second.input_ids) == 0
    third = s.next_batch()
    assert _rows(third) == [("i1", 2, 3), ("ii2", 0, 1)]
    np.testing.assert_array_equal(third.pixels[:, 0, 0, 0], [2, 3])  # each work's own pixels, in order
    np.testing.assert_array_equal(third.cu_seqlens, [0, 17, 34])
    assert _rows(s.next_batch()) == [("t2", 0, 1)]
    assert s.next_batch() is None and s.queued_tokens == 0
