"""A chunked job's counts (shared/jobs/chunk_progress.py through shared/jobs/status.py): documents and chunks each
counted once whatever order token batches are stored, stored again, given up or cut again in."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from embedfleet.shared.jobs.chunk_progress import count_cut
from embedfleet.shared.jobs.progress import Ledger, Rows
from embedfleet.shared.jobs.state import CANCELLED, DeadBatch, JobState
from embedfleet.shared.jobs.status import count_done, count_failed, late_rows
from embedfleet.shared.protocol import ChunkRows
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking

# job batch 0: three documents of 3, 1 and 2 chunks, six rows packed into token batches of rows
# [0, 2), [2, 5) and [5, 6): document 0's chunks span the first two, document 2's the last two
ROWS = [(0, 0, 3, 0, 9), (0, 1, 3, 8, 17), (0, 2, 3, 16, 20), (1, 0, 1, 0, 5), (2, 0, 2, 0, 7), (2, 1, 2, 6, 12)]
PARTS = [(0, 2), (2, 5), (5, 6)]


def part(lo: int, hi: int) -> tuple[Rows, ChunkRows]:
    return Rows(0, lo, hi - lo, len(ROWS)), ChunkRows.of(3, ROWS[lo:hi])


def fresh_state() -> JobState:
    return JobState("j", documents=3, batches=1, status="running", chunking=JobChunking(ChunkSpec(8, 1)))


def dead(stage: str, start: int) -> DeadBatch:
    return DeadBatch(stage, 0, start, 3, 1, "given up")


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_stored_in_any_order_and_twice_counts_each_once(order):
    state = fresh_state()
    for i in [*order, *order]:  # every token batch stored again (a worker died before acknowledging it)
        rows, chunks = part(*PARTS[i])
        state = count_done(state, rows, 10, chunks)
    assert (state.done, state.chunks_done, state.tokens, state.status) == (3, 6, 30, "done")


def test_a_document_is_done_only_once_its_last_chunk_is_stored():
    state = count_done(fresh_state(), part(0, 2)[0], 4, part(0, 2)[1])
    assert state.done == 0 and state.chunks_done == 2  # document 0 has a chunk in the next batch
    state = count_done(state, part(2, 5)[0], 4, part(2, 5)[1])
    assert state.done == 2 and state.chunks_done == 5  # documents 0 and 1; document 2 waits for row 5


def test_a_given_up_batch_fails_the_documents_it_holds_a_chunk_of():
    state = count_done(fresh_state(), part(0, 2)[0], 4, part(0, 2)[1])
    state = count_failed(state, part(2, 5)[0], dead("worker", 2), part(2, 5)[1])
    state = count_done(state, part(5, 6)[0], 4, part(5, 6)[1])
    state = count_done(state, part(2, 5)[0], 4, part(2, 5)[1])  # stored after all (a late copy): counts nothing more
    assert (state.done, state.failed, state.chunks_done, state.chunks_failed) == (0, 3, 3, 3)
    assert state.status == "done_with_errors"


def test_a_batch_given_up_after_it_was_stored_changes_nothing():
    state = fresh_state()
    for lo, hi in PARTS:
        state = count_done(state, part(lo, hi)[0], 1, part(lo, hi)[1])
    state = count_failed(state, part(2, 5)[0], dead("worker", 2), part(2, 5)[1])
    assert (state.done, state.failed, state.chunks_done, state.chunks_failed) == (3, 0, 6, 0)


def test_a_document_the_tokenizer_gave_up_is_failed_once_and_the_others_are_done():
    state = fresh_state()
    rows = [(0, 0, 1, 0, 3), (2, 0, 1, 0, 4)]  # document 1 had too many chunks: it has no rows
    for _ in range(2):  # the tokenizer's batch delivered twice
        state = count_failed(state, Rows(0, 1, 1, 3), dead("tokenizer", 1))
        state = count_cut(state, 0, 2)
    state = count_done(state, Rows(0, 0, 2, 2), 5, ChunkRows.of(3, rows))
    assert (state.done, state.failed, state.chunks, state.chunks_done, state.status) == (2, 1, 2, 2, "done_with_errors")
    assert len(state.dead) == 1


def test_chunks_are_counted_once_a_batch_cut():
    state, counted = replace(fresh_state(), batches=3), []
    for b, n in [(0, 6), (1, 4), (0, 6), (2, 5), (1, 4)]:
        state = count_cut(state, b, n)
        counted.append(state.chunks)
    assert counted == [6, 10, 10, 15, 15]
    assert state.cut == Ledger(((0, 1),), {})  # the ledger merged: one range


def test_a_cancel_freezes_the_counts_and_late_chunks_are_found():
    state = replace(count_done(fresh_state(), part(0, 2)[0], 4, part(0, 2)[1]), status=CANCELLED)
    rows, chunks = part(2, 5)
    assert count_done(state, rows, 4, chunks) == state and state.chunks_done == 2
    assert count_cut(state, 0, 6) == state  # nor are chunks cut after it counted
    assert late_rows(state, rows, chunked=True) and not late_rows(state, part(0, 2)[0], chunked=True)
