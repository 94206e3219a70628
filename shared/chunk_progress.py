"""Exact progress of a chunked bulk job: its documents and its chunks, each counted once.

A tokenizer cuts job batch b into rows, a chunk each, a document's chunks one after another
(shared/protocol/chunk_rows.py), and packs them into token batches of rows [s, s + n) of the batch's
C_b rows. Three ledgers of shared/progress.py keep the counts exact whichever process dies when, each
recording the same thing twice as once:

- the chunk rows stored or given up (``CHUNK_LEDGER``, rows of C_b): ``chunks_done``, ``chunks_failed``;
- the documents settled (``LEDGER``, rows of the batch's documents): ``done`` when the last of a
  document's chunks is stored, ``failed`` when one of them is given up first (a document is stored
  whole or not at all), or when the tokenizer gives the document up (more chunks than it may have);
- the job batches cut (``CUT_LEDGER``, batch indices as the rows of one ledger batch): ``chunks``, the
  chunks of every batch cut so far (the job's chunk count once all are cut).

Pure functions over a job's JSON state, as shared/jobs.py applies them under compare-and-set.
"""

from __future__ import annotations

from shared.progress import CHUNK_LEDGER, CUT_LEDGER, Rows, account, accounted
from shared.protocol import ChunkRows


def _add(state: dict, key: str, n: int) -> None:
    if n:
        state[key] = state.get(key, 0) + n


def store_chunks(state: dict, rows: Rows, chunks: ChunkRows, tokens: int) -> int:
    """Stored chunk ``rows`` (job batch rows, ``chunks`` saying whose): counted unless counted before,
    and each document whose chunks are now all stored counted done. Returns the chunks that were new."""
    fresh = account(state, rows, CHUNK_LEDGER)
    if not fresh:
        return 0
    _add(state, "chunks_done", fresh)
    _add(state, "tokens", tokens)
    for doc, first, count, _, _ in chunks.documents_in(rows.start):
        if accounted(state, Rows(rows.batch, first, count), CHUNK_LEDGER) == count:
            # a document with a chunk given up was counted failed then: not counted again here
            _add(state, "done", account(state, Rows(rows.batch, doc, 1, chunks.documents)))
    return fresh


def fail_chunks(state: dict, rows: Rows, chunks: ChunkRows) -> int:
    """Given-up chunk ``rows``: each document with one of them not stored before counts as failed
    (unless it was counted before), the rows as given-up chunks. Returns the documents newly failed."""
    failed = 0
    for doc, _, _, lo, hi in chunks.documents_in(rows.start):
        if accounted(state, Rows(rows.batch, rows.start + lo, hi - lo), CHUNK_LEDGER) < hi - lo:
            failed += account(state, Rows(rows.batch, doc, 1, chunks.documents))
    _add(state, "failed", failed)
    _add(state, "chunks_failed", account(state, rows, CHUNK_LEDGER))
    return failed


def count_cut(state: dict, batch: int, chunks: int) -> int:
    """Job batch ``batch`` cut into ``chunks`` rows: added to the job's ``chunks`` once. Returns them
    when they were new, else 0."""
    if not account(state, Rows(0, batch, 1, state.get("batches", 0)), CUT_LEDGER):
        return 0
    _add(state, "chunks", chunks)
    return chunks
