"""Exact progress of a chunked bulk job: its documents and its chunks, each counted once.

A tokenizer cuts job batch b into rows, a chunk each, a document's chunks one after another
(shared/protocol/chunk_rows.py), and packs them into token batches of rows [s, s + n) of the batch's
C_b rows. Three ledgers of shared/jobs/progress.py keep the counts exact whichever process dies when, each
recording the same thing twice as once:

- the chunk rows stored or given up (``accounted_chunks``, rows of C_b): ``chunks_done``, ``chunks_failed``;
- the documents settled (``accounted``, rows of the batch's documents): ``done`` when the last of a
  document's chunks is stored, ``failed`` when one of them is given up first (a document is stored
  whole or not at all), or when the tokenizer gives the document up (more chunks than it may have);
- the job batches cut (``cut``, batch indices as the rows of one ledger batch): ``chunks``, the
  chunks of every batch cut so far (the job's chunk count once all are cut).

Pure functions from a job's state to the next (shared/jobs/status.py applies them under compare-and-set).
"""

from __future__ import annotations

from dataclasses import replace

from embedfleet.shared.jobs.progress import Rows
from embedfleet.shared.jobs.state import CANCELLED, JobState
from embedfleet.shared.protocol import ChunkRows


def store_chunks(state: JobState, rows: Rows, chunks: ChunkRows, tokens: int) -> JobState:
    """Stored chunk ``rows`` (job batch rows, ``chunks`` saying whose): counted unless counted before,
    and each document whose chunks are now all stored counted done."""
    stored, fresh = state.accounted_chunks.account(rows)
    if not fresh:
        return state
    documents, done = state.accounted, 0
    for doc, first, count, _, _ in chunks.documents_in(rows.start):
        if stored.accounted(Rows(rows.batch, first, count)) == count:
            # a document with a chunk given up was counted failed then: not counted again here
            documents, settled = documents.account(Rows(rows.batch, doc, 1, chunks.documents))
            done += settled
    return replace(
        state,
        accounted_chunks=stored,
        accounted=documents,
        chunks_done=state.chunks_done + fresh,
        tokens=state.tokens + tokens,
        done=state.done + done,
    )


def fail_chunks(state: JobState, rows: Rows, chunks: ChunkRows) -> JobState:
    """Given-up chunk ``rows``: each document with one of them not stored before counts as failed
    (unless it was counted before), the rows as given-up chunks."""
    documents, failed = state.accounted, 0
    for doc, _, _, lo, hi in chunks.documents_in(rows.start):
        if state.accounted_chunks.accounted(Rows(rows.batch, rows.start + lo, hi - lo)) < hi - lo:
            documents, settled = documents.account(Rows(rows.batch, doc, 1, chunks.documents))
            failed += settled
    given_up, fresh = state.accounted_chunks.account(rows)
    return replace(
        state,
        accounted=documents,
        accounted_chunks=given_up,
        failed=state.failed + failed,
        chunks_failed=state.chunks_failed + fresh,
    )


def count_cut(state: JobState, batch: int, chunks: int) -> JobState:
    """Job batch ``batch`` cut into ``chunks`` rows: added to the job's ``chunks`` once; not once the job
    is cancelled (its counts stay as the cancel found them)."""
    if state.status == CANCELLED:
        return state
    cut, fresh = state.cut.account(Rows(0, batch, 1, state.batches))
    if not fresh:
        return state
    return replace(state, cut=cut, chunks=state.chunks + chunks)
