"""A job's state in the job bucket (created by shared/job_streams.py): read, and changed under
compare-and-set, a ``JobState`` (shared/job_state.py) each way.

``update_state(kv, job, change)`` reads the state (a new ``JobState(job)`` when there is none), writes
``change(state)`` in its place if nothing was written meanwhile, and otherwise reads again and calls
``change`` again: every writer's change lands, none is lost to a concurrent one. ``change`` is a pure
function from the state read to the state to write (``dataclasses.replace``), called once a try.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from nats.js.errors import BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from embedfleet.shared.job_state import JobState
from embedfleet.shared.retry import retry_transient, transient

_KV_KEY = re.compile(r"[-/_=.a-zA-Z0-9]+")
# a job id is a KV key and a token of subjects and message ids: short, so a control line stays far
# under the server's limit (4 KB) with the prefix around it
MAX_JOB_ID = 128
_CONFLICTS = 1000  # compare-and-set retries before a state update is given up


def has_state_key(job: str) -> bool:
    """Whether ``job`` can name a state entry (a KV key: dot-separated tokens, none empty); an untrusted
    id may not."""
    return (
        len(job) <= MAX_JOB_ID
        and bool(_KV_KEY.fullmatch(job))
        and not job.startswith(".")
        and not job.endswith(".")
        and ".." not in job
    )


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
                try:
                    entry = await kv.get(job)
                    state, revision = JobState.decode(entry.value, job), entry.revision
                except KeyNotFoundError:
                    state, revision = JobState(job), None
                state = change(state)
                if not isinstance(state, JobState):
                    raise TypeError(f"a job state's change gives a JobState, not {type(state).__name__}")
                if revision is None:
                    await kv.create(job, state.encode())
                else:
                    await kv.update(job, state.encode(), last=revision)
                return state
            except (KeyWrongLastSequenceError, BadRequestError):
                conflicts += 1  # someone else wrote first: read again (a request the server always refuses ends)
                if conflicts > _CONFLICTS:
                    raise

    return await retry_transient(attempt, transient, patience, f"job {job}: state update")


async def read_state(kv: KeyValue, job: str) -> JobState | None:
    """A job's state, or None when there is no such job; JobStateError for one this code did not write."""
    try:
        return JobState.decode((await kv.get(job)).value, job)
    except KeyNotFoundError:
        return None
