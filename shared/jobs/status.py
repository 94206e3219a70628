"""How a job's state moves on as its work is settled: documents counted stored or given up (each once,
shared/jobs/progress.py), the job settled (done, or done with errors) once every document is, cancelled; and
where its store stands (reindex --sink, POST /v1/jobs "sink").

Each is a pure function from the state read to the state to write, which shared/jobs/bucket.py's
``update_state`` applies under compare-and-set; ``time.time()`` is the clock of the process applying it.
"""

from __future__ import annotations

import time
from dataclasses import replace

from nats.js.kv import KeyValue

from embedfleet.shared.jobs.bucket import update_state
from embedfleet.shared.jobs.chunk_progress import fail_chunks, store_chunks
from embedfleet.shared.jobs.progress import Rows
from embedfleet.shared.jobs.state import (
    CANCELLED,
    DONE,
    DONE_WITH_ERRORS,
    FINISHED,
    MAX_DEAD_RECORDS,
    DeadBatch,
    JobState,
    StoreWait,
)
from embedfleet.shared.protocol import ChunkRows


def count_done(state: JobState, rows: Rows, tokens: int, chunks: ChunkRows | None = None) -> JobState:
    """Stored ``rows``: counted as done unless they were counted before (a batch delivered again after
    its holder died between storing and counting), or the job was cancelled before they were: its
    counts stay as the cancel found them (``late_rows`` tells the storer to remove their result).
    ``chunks``: the rows are chunks of a chunked job (shared/jobs/chunk_progress.py)."""
    if state.status == CANCELLED:
        return state
    if chunks is not None:
        state = store_chunks(state, rows, chunks, tokens)
    else:
        accounted, fresh = state.accounted.account(rows)
        if fresh:
            state = replace(state, accounted=accounted, done=state.done + fresh, tokens=state.tokens + tokens)
    return settle(state)


def late_rows(state: JobState, rows: Rows, chunked: bool = False) -> bool:
    """Whether stored ``rows`` (``chunked``: chunk rows) came after their job's cancel and were not
    counted before it: their result must go, so that what the results stream holds is what the job's
    state counts as done."""
    ledger = state.accounted_chunks if chunked else state.accounted
    return state.status == CANCELLED and ledger.accounted(rows) < rows.count


def count_failed(state: JobState, rows: Rows, dead: DeadBatch, chunks: ChunkRows | None = None) -> JobState:
    """Given-up ``rows`` (``chunks``: chunk rows of a chunked job, whose documents fail): counted as
    failed unless already accounted for, and the batch listed once (up to a limit); not once the job
    is cancelled (its counts stay as the cancel found them)."""
    if state.status == CANCELLED:
        return state
    if chunks is not None:
        state = fail_chunks(state, rows, chunks)
    else:
        accounted, fresh = state.accounted.account(rows)
        state = replace(state, accounted=accounted, failed=state.failed + fresh)
    place = (dead.stage, dead.batch, dead.start)
    if len(state.dead) < MAX_DEAD_RECORDS and all((d.stage, d.batch, d.start) != place for d in state.dead):
        state = _with_error(
            replace(state, dead=(*state.dead, dead)), f"{dead.stage}: batch {dead.batch}: {dead.reason}"
        )
    return settle(state)


def _with_error(state: JobState, message: str) -> JobState:
    if len(state.errors) >= MAX_DEAD_RECORDS:
        return state
    return replace(state, errors=(*state.errors, message[:500]))


def settle(state: JobState) -> JobState:
    """Every document accounted for (and, with a store, every row in it): the job is done, or done with
    errors when some were given up. A cancelled job stays cancelled."""
    total = state.documents
    if state.status == CANCELLED or not total or state.done + state.failed < total:
        return state
    if (
        state.sink is not None and state.sink_done is None
    ):  # done once its rows are in the store (shared/jobs/sink_writer.py)
        return state
    status = DONE_WITH_ERRORS if state.failed else DONE
    if state.status == status:
        return state
    return replace(state, status=status, finished=state.finished if state.finished is not None else time.time())


class _NoJob(Exception):
    pass


def cancelled(state: JobState) -> JobState:
    """The job cancelled (a job that finished keeps its state)."""
    if not state.submitted:
        raise _NoJob
    if state.status in FINISHED:
        return state
    now = time.time()
    return replace(
        state, status=CANCELLED, cancelled=now, finished=state.finished if state.finished is not None else now
    )


async def cancel_job(kv: KeyValue, job: str) -> JobState | None:
    """Mark a job cancelled and return its state; None when there is no such job. Publishers stop
    before their next batch, tokenizers and workers drop its queued batches unprocessed (see
    ``embedfleet.shared.jobs.work_queue.Cancellations``), and what was stored stays in the results stream. A job that
    already finished keeps its state."""
    try:
        return await update_state(kv, job, cancelled)
    except _NoJob:
        return None


def sink_waiting(state: JobState, message: str, since: float) -> JobState:
    """The store refused a batch and the collector waits to write it again (unix time ``since``)."""
    return replace(state, sink_error=StoreWait(message[:500], since))


def sink_written(state: JobState, rows: int) -> JobState:
    """``rows`` of the job are durably in the store: a wait for it, if any, is over."""
    # a resumed run writes again what an earlier one did
    return replace(state, sink_rows=max(rows, state.sink_rows), sink_error=None)


def sink_finished(state: JobState) -> JobState:
    """The last row is in the store and its index built: the job may be done now."""
    return settle(replace(state, sink_error=None, sink_done=time.time()))
