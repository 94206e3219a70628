"""Exact progress: rows recorded twice (a batch delivered again after its holder died between storing
and counting) count once; the ledger stays small; a cancelled job keeps its status and its counts."""

import random
from dataclasses import replace

from embedfleet.shared.jobs.progress import Ledger, Rows
from embedfleet.shared.jobs.state import CANCELLED, DeadBatch, JobState
from embedfleet.shared.jobs.status import count_done, count_failed, late_rows


def test_rows_count_once_and_whole_batches_fold_into_ranges():
    ledger, fresh = Ledger().account(Rows(0, 0, 16, 32))
    assert fresh == 16
    assert ledger.account(Rows(0, 0, 16, 32)) == (ledger, 0)  # the same token batch again
    assert ledger == Ledger((), {0: ((0, 16),)})
    ledger, fresh = ledger.account(Rows(0, 16, 16, 32))
    assert fresh == 16 and ledger == Ledger(((0, 1),), {})  # batch 0 complete: one range, no rows kept
    assert ledger.account(Rows(0, 8, 4, 32))[1] == 0
    ledger, fresh = ledger.account(Rows(2, 0, 10, 10))
    assert fresh == 10
    ledger, fresh = ledger.account(Rows(1, 0, 10, 10))
    assert fresh == 10 and ledger == Ledger(((0, 3),), {})
    # chunks cut differently on a second tokenization overlap the first: only the new rows count
    ledger, fresh = ledger.account(Rows(5, 0, 6, 20))
    assert fresh == 6
    ledger, fresh = ledger.account(Rows(5, 4, 6, 20))
    assert fresh == 4 and ledger.part == {5: ((0, 10),)}
    assert ledger.accounted(Rows(5, 8, 4, 20)) == 2 and ledger.accounted(Rows(1, 3, 5, 10)) == 5


def test_a_ledger_is_a_value_never_changed_by_accounting():
    before = Ledger((), {3: ((0, 4),)})
    after, _ = before.account(Rows(3, 4, 4, 8))
    assert before == Ledger((), {3: ((0, 4),)}) and after == Ledger(((3, 4),), {})


def test_malformed_rows_count_nothing_or_once():
    ledger = Ledger()
    assert ledger.account(Rows(-1, 0, 5)) == (ledger, 0)  # no batch index (an undecodable batch)
    assert ledger.account(Rows(3, 0, 0, 8)) == (ledger, 0)  # no documents known
    ledger, fresh = ledger.account(Rows(3, 6, 4, 8))  # past its own total: counted, never folded
    assert fresh == 4 and ledger.account(Rows(3, 6, 4, 8))[1] == 0
    assert ledger.part == {3: ((6, 10),)}


def test_any_order_and_repeats_give_exact_counts_and_a_small_ledger():
    rng = random.Random(7)
    batches = {b: 64 if b < 99 else 17 for b in range(100)}  # the last job batch is short
    chunks = [Rows(b, s, min(16, n - s), n) for b, n in batches.items() for s in range(0, n, 16)]
    deliveries = chunks + rng.sample(chunks, 150)  # 150 redeliveries
    rng.shuffle(deliveries)
    state = JobState("j", documents=sum(batches.values()), status="running")
    for i, rows in enumerate(deliveries):
        state = count_done(state, rows, tokens=rows.count * 10)
        if i == len(deliveries) // 2:
            assert len(replace(JobState("j"), accounted=state.accounted).encode()) < 8000
    assert state.done == 99 * 64 + 17 and state.tokens == 10 * state.done
    assert state.status == "done" and state.accounted == Ledger(((0, 100),), {})


def test_a_batch_given_up_twice_is_failed_and_listed_once():
    state = count_done(JobState("j", documents=20, status="running"), Rows(0, 0, 10, 10), 100)
    dead = DeadBatch("worker", 1, 0, 10, 5, "engine error")
    state = count_failed(state, Rows(1, 0, 10, 10), dead)
    assert state.failed == 10
    state = count_failed(state, Rows(1, 0, 10, 10), replace(dead, deliveries=6))  # recorded again after a crash
    assert state.failed == 10 and state.dead == (dead,) and state.errors == ("worker: batch 1: engine error",)
    assert state.status == "done_with_errors" and state.done == 10
    # a stored batch whose copy is then given up by the server (its holder died before acknowledging) stays done
    state = count_failed(state, Rows(0, 0, 10, 10), replace(dead, batch=0))
    assert (state.done, state.failed) == (10, 10)


def test_a_cancel_freezes_the_counts_and_finds_the_rows_stored_after_it_late():
    """Rows stored after the cancel are not counted (the figures the cancel reported stay), and are
    late: their result is removed. Rows counted before the cancel, stored again, are not late."""
    state = replace(count_done(JobState("j", documents=20), Rows(0, 0, 10, 10), 50), status=CANCELLED)
    assert count_done(state, Rows(1, 0, 10, 10), 50) == state
    assert count_failed(state, Rows(1, 0, 10, 10), DeadBatch("worker", 1, 0, 10, 1, "engine error")) == state
    assert (state.done, state.failed, state.tokens, state.status) == (10, 0, 50, CANCELLED)
    assert late_rows(state, Rows(1, 0, 10, 10)) and not late_rows(state, Rows(0, 0, 10, 10))
    assert not late_rows(JobState("j", documents=20, status="running"), Rows(1, 0, 10, 10))
