"""A job's state in the job bucket (created by shared/jobs/streams.py): read, and changed under
compare-and-set, a ``JobState`` (shared/jobs/state.py) each way.

A job's state is two keys: its record, ``<job>`` (what its submitter, the gateway and the operator
write: the submission, the owner, the store, a cancel), and its progress, ``progress.<job>``
(``PROGRESS``: the counts the tokenizers and workers write, and the status they settle the job to when
its last documents are counted). The NATS roles follow the split (shared/permissions.py): a tokenizer
or worker may write ``progress.>`` only, so it can neither rewrite nor delete a job's record. Read, the
two are one state (``merged``); a record written before the split, with its counts in it and no
progress key, reads as it was written.

``update_state(kv, job, change)`` reads the state (a new ``JobState(job)`` when there is none), writes
``change(state)`` in its place if nothing was written meanwhile, and otherwise reads again and calls
``change`` again: every writer's change lands, none is lost to a concurrent one. ``change`` is a pure
function from the state read to the state to write (``dataclasses.replace``), called once a try. Only
the keys whose fields it changed are written: a change of counts (and of the status they settle)
writes the progress key alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import fields, replace

from nats.js.errors import BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from embedfleet.shared.errors import shown
from embedfleet.shared.jobs.state import (
    CANCELLED,
    DONE,
    DONE_WITH_ERRORS,
    RUNNING,
    STALLED,
    JobState,
    JobStateError,
)
from embedfleet.shared.nats.retry import retry_transient, transient

_KV_KEY = re.compile(r"[-/_=.a-zA-Z0-9]+")
# a job id is a KV key and a token of subjects and message ids: short, so a control line stays far
# under the server's limit (4 KB) with the prefix around it
MAX_JOB_ID = 128
_CONFLICTS = 1000  # compare-and-set retries before a state update is given up
PROGRESS_PREFIX = "progress."  # a job's progress key: the prefix and its id (so no job id starts with it)
# the fields the progress key holds (the rest are the record's)
PROGRESS = frozenset(
    {"done", "failed", "tokens", "chunks", "chunks_done", "chunks_failed", "errors", "dead"}
    | {"accounted", "accounted_chunks", "cut"}
)
_SETTLED = (DONE, DONE_WITH_ERRORS)  # statuses the progress key may hold (with ``finished``)
_STATUS = ("status", "finished")


def has_state_key(job: str) -> bool:
    """Whether ``job`` can name a state entry (a KV key: dot-separated tokens, none empty, not a
    progress key); an untrusted id may not."""
    return (
        len(job) <= MAX_JOB_ID
        and bool(_KV_KEY.fullmatch(job))
        and not job.startswith(".")
        and not job.endswith(".")
        and ".." not in job
        and not job.startswith(PROGRESS_PREFIX)
    )


def progress_key(job: str) -> str:
    return PROGRESS_PREFIX + job


def _progress(data: bytes | None, job: str) -> JobState:
    """A progress key's content: counts, and a settled status; JobStateError for anything else."""
    state = JobState.decode(data, job)
    other = [f.name for f in fields(state) if f.name not in PROGRESS and f.name not in (*_STATUS, "job")]
    if any(getattr(state, name) != getattr(JobState(job), name) for name in other) or state.status not in (
        None,
        *_SETTLED,
    ):
        raise JobStateError(f"job {shown(job)}: its progress holds what only its record may")
    return state


def merged(record: JobState | None, progress: JobState | None, job: str) -> JobState | None:
    """One state of a job's record and progress (None where that key is not there); None for neither.
    The progress key's counts stand for the record's; its settled status for a running (or stalled)
    record's, whose cancel or own end stands."""
    if progress is None:
        return record
    state = replace(record or JobState(job), **{name: getattr(progress, name) for name in PROGRESS})
    if progress.status in _SETTLED and state.status in (RUNNING, STALLED):
        state = replace(state, status=progress.status, finished=progress.finished)
    return state


async def _get(kv: KeyValue, key: str) -> tuple[bytes | None, int | None]:
    """A key's value and revision; (None, None) when there is none."""
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None, None
    return entry.value or b"", entry.revision


async def update_state(
    kv: KeyValue, job: str, change: Callable[[JobState], JobState], patience: float = 300.0
) -> JobState:
    """Read-modify-write a job's state with compare-and-set, retrying on a concurrent writer, and on a
    lost connection for up to ``patience`` seconds (the server may be restarting). Returns the state
    written. A stored state this code did not write raises JobStateError, and nothing is written."""
    if not has_state_key(job):
        raise ValueError(f"job id {job[:100]!r} cannot name a job state")

    async def attempt() -> JobState:
        conflicts = 0
        while True:
            try:
                # the progress first: a counter that reads the record after a cancel sees the cancel, and one
                # that read it before is fenced off below
                pdata, prevision = await _get(kv, progress_key(job))
                data, revision = await _get(kv, job)
                record = JobState.decode(data, job) if revision is not None else None
                progress = _progress(pdata, job) if prevision is not None else None
                before = merged(record, progress, job) or JobState(job)
                state = change(before)
                if not isinstance(state, JobState):
                    raise TypeError(f"a job state's change gives a JobState, not {type(state).__name__}")
                changed = {f.name for f in fields(state) if getattr(state, f.name) != getattr(before, f.name)}
                counted = changed & PROGRESS
                # counts that settle the job: its status goes with them (the record's writers' own)
                settles = bool(changed & set(_STATUS)) and changed <= PROGRESS | set(_STATUS)
                settles = settles and state.status in _SETTLED
                if counted or settles:
                    # a first progress key takes the counts the record held (one written before the split)
                    new = replace(JobState(job), **{n: getattr(state, n) for n in PROGRESS})
                    settled = state if settles else progress
                    if settled is not None:
                        new = replace(new, status=settled.status, finished=settled.finished)
                    await _write(kv, progress_key(job), new, prevision)
                if own := changed - PROGRESS - (set(_STATUS) if settles else set()):
                    written = replace(record or JobState(job), **{n: getattr(state, n) for n in own})
                    await _write(kv, job, written, revision)
                    if "status" in own and state.status == CANCELLED and not counted:
                        await _fence(kv, job, pdata, prevision, before)
                return state
            except (KeyWrongLastSequenceError, BadRequestError):
                conflicts += 1  # someone else wrote first: read again (a request the server always refuses ends)
                if conflicts > _CONFLICTS:
                    raise

    return await retry_transient(attempt, transient, patience, f"job {job}: state update")


async def _fence(kv: KeyValue, job: str, pdata: bytes | None, prevision: int | None, before: JobState) -> None:
    """The progress key written again as it was read, once the record says the job is cancelled: the
    two keys are written apart, so a tokenizer or worker that read the progress before the change could
    otherwise still count into a cancelled job; now its compare-and-set fails and it reads the cancel. Where
    its write landed first, this one fails instead, and the change is read again with those counts."""
    if prevision is None:
        await kv.create(progress_key(job), replace(JobState(job), **{n: getattr(before, n) for n in PROGRESS}).encode())
    else:
        await kv.update(progress_key(job), pdata or b"", last=prevision)


async def _write(kv: KeyValue, key: str, state: JobState, revision: int | None) -> None:
    if revision is None:
        await kv.create(key, state.encode())
    else:
        await kv.update(key, state.encode(), last=revision)


async def purge_state(kv: KeyValue, job: str) -> None:
    """Remove a job's state: its progress, then its record (a record left without its progress reads
    as a job not counted yet, never counts without a record)."""
    await kv.purge(progress_key(job))
    await kv.purge(job)


async def read_state(kv: KeyValue, job: str) -> JobState | None:
    """A job's state, or None when there is no such job; JobStateError for one this code did not write."""
    data, revision = await _get(kv, job)
    return await with_progress(kv, JobState.decode(data, job) if revision is not None else None, job)


async def with_progress(kv: KeyValue, record: JobState | None, job: str) -> JobState | None:
    """``record`` (a job's record as read, None: not there) with the job's progress."""
    pdata, prevision = await _get(kv, progress_key(job))
    return merged(record, _progress(pdata, job) if prevision is not None else None, job)
