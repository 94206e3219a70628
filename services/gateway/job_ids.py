"""Job ids from HTTP, checked at the edge: an id names a key of the job bucket and a token of subjects,
so one with an empty token (``a..b``, ``.a``, ``a.``, ``""``) would make NATS requests that never get
an answer. Such an id is refused at once (400) instead."""

from __future__ import annotations

from shared.errors import ErrorCode
from shared.jobs import MAX_JOB_ID, has_state_key
from services.gateway.errors import ApiError

_RULE = f"at most {MAX_JOB_ID} letters, digits and - _ = / ., with no empty part between dots (not '', '.a', 'a.', 'a..b')"


def valid_job_id(job: str) -> bool:
    return has_state_key(job) and ".." not in job


def check_job_id(job: object) -> str:
    """``job`` when it can name a job; else ApiError 400 (param ``id``)."""
    if not isinstance(job, str):
        raise ApiError(ErrorCode.INVALID_REQUEST, "'id' must be a string", "id")
    if not valid_job_id(job):
        raise ApiError(ErrorCode.INVALID_REQUEST, f"invalid job id {job[:100]!r}: {_RULE}", "id")
    return job


def check_job_field(doc: dict) -> None:
    """The ``id`` a job's submission gives, if any (none: the gateway makes one)."""
    if "id" in doc:
        check_job_id(doc["id"])
