"""Job ids from HTTP, checked at the edge by the rule ``embedfleet reindex --job-id`` follows too
(shared/jobs/ids.py): an id that cannot name a job is refused at once (400), and so is one with a ``/``,
which the job's routes could not take (``/v1/jobs/q/results`` is job ``q``'s results)."""

from __future__ import annotations

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.jobs.ids import new_job_id_problem


def check_job_id(job: object) -> str:
    """``job`` when it can name a job; else ApiError 400 (param ``id``)."""
    if not isinstance(job, str):
        raise ApiError(ErrorCode.INVALID_REQUEST, "'id' must be a string", "id")
    problem = new_job_id_problem(job)
    if problem:
        raise ApiError(ErrorCode.INVALID_REQUEST, problem, "id")
    return job
