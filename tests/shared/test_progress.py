"""Exact progress: rows recorded twice (a batch delivered again after its holder died between storing
and counting) count once; the ledger stays small; a cancelled job keeps its status and its counts."""

import json
import random

from shared.jobs import CANCELLED, count_done, count_failed, late_rows
from shared.progress import LEDGER, Rows, account


def test_rows_count_once_and_whole_batches_fold_into_ranges():
    state: dict = {}
    assert account(state, Rows(0, 0, 16, 32)) == 16
    assert account(state, Rows(0, 0, 16, 32)) == 0  # the same token batch again
    assert state[LEDGER] == {"whole": [], "part": {"0": [[0, 16]]}}
    assert account(state, Rows(0, 16, 16, 32)) == 16
    assert state[LEDGER] == {"whole": [[0, 1]], "part": {}}  # batch 0 complete: one range, no rows kept
    assert account(state, Rows(0, 8, 4, 32)) == 0
    assert account(state, Rows(2, 0, 10, 10)) == 10
    assert account(state, Rows(1, 0, 10, 10)) == 10
    assert state[LEDGER] == {"whole": [[0, 3]], "part": {}}
    # chunks cut differently on a second tokenization overlap the first: only the new rows count
    assert account(state, Rows(5, 0, 6, 20)) == 6
    assert account(state, Rows(5, 4, 6, 20)) == 4
    assert state[LEDGER]["part"] == {"5": [[0, 10]]}


def test_malformed_rows_count_nothing_or_once():
    state: dict = {}
    assert account(state, Rows(-1, 0, 5)) == 0  # no batch index (an undecodable batch)
    assert account(state, Rows(3, 0, 0, 8)) == 0  # no documents known
    assert account(state, Rows(3, 6, 4, 8)) == 4  # past its own total: counted, never folded
    assert account(state, Rows(3, 6, 4, 8)) == 0
    assert state[LEDGER]["part"] == {"3": [[6, 10]]}


def test_any_order_and_repeats_give_exact_counts_and_a_small_ledger():
    rng = random.Random(7)
    batches = {b: 64 if b < 99 else 17 for b in range(100)}  # the last job batch is short
    chunks = [Rows(b, s, min(16, n - s), n) for b, n in batches.items() for s in range(0, n, 16)]
    deliveries = chunks + rng.sample(chunks, 150)  # 150 redeliveries
    rng.shuffle(deliveries)
    state = {"documents": sum(batches.values()), "status": "running"}
    for i, rows in enumerate(deliveries):
        count_done(state, rows, tokens=rows.count * 10)
        if i == len(deliveries) // 2:
            assert len(json.dumps(state[LEDGER])) < 8000
    assert state["done"] == 99 * 64 + 17 and state["tokens"] == 10 * state["done"]
    assert state["status"] == "done" and state[LEDGER] == {"whole": [[0, 100]], "part": {}}


def test_a_batch_given_up_twice_is_failed_and_listed_once():
    state = {"documents": 20, "status": "running"}
    count_done(state, Rows(0, 0, 10, 10), 100)
    record = {"stage": "worker", "batch": 1, "start": 0, "documents": 10, "deliveries": 5, "reason": "engine error"}
    assert count_failed(state, Rows(1, 0, 10, 10), record) == 10
    assert count_failed(state, Rows(1, 0, 10, 10), {**record, "deliveries": 6}) == 0  # recorded again after a crash
    assert state["failed"] == 10 and len(state["dead"]) == 1 and len(state["errors"]) == 1
    assert state["status"] == "done_with_errors" and state["done"] == 10
    # a stored batch whose copy is then given up by the server (its holder died before acknowledging) stays done
    assert count_failed(state, Rows(0, 0, 10, 10), {**record, "batch": 0}) == 0
    assert (state["done"], state["failed"]) == (10, 10)


def test_a_cancel_freezes_the_counts_and_finds_the_rows_stored_after_it_late():
    """Rows stored after the cancel are not counted (the figures the cancel reported stay), and are
    late: their result is removed. Rows counted before the cancel, stored again, are not late."""
    state = {"documents": 20}
    count_done(state, Rows(0, 0, 10, 10), 50)
    state["status"] = CANCELLED
    assert count_done(state, Rows(1, 0, 10, 10), 50) == 0
    assert count_failed(state, Rows(1, 0, 10, 10), {"stage": "worker", "batch": 1, "start": 0}) == 0
    assert (state["done"], state.get("failed", 0), state["tokens"], state["status"]) == (10, 0, 50, CANCELLED)
    assert late_rows(state, Rows(1, 0, 10, 10)) and not late_rows(state, Rows(0, 0, 10, 10))
    assert not late_rows({"documents": 20, "status": "running"}, Rows(1, 0, 10, 10))
