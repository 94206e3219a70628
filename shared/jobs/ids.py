"""Job ids given by people (POST /v1/jobs's ``id``, ``embedfleet reindex --job-id``), checked before
anything is read or published: an id names a key of the job bucket, whose keys are dot-separated
tokens, so one with an empty token (``a..b``, ``.a``, ``a.``, ``""``) cannot name a job.

A new job's id has no ``/`` either: the bucket would take it, but HTTP reads a job at
``/v1/jobs/ID`` and ``/v1/jobs/ID/results``, where ``q/results`` would be read as job ``q``'s results."""

from __future__ import annotations

from embedfleet.shared.jobs.bucket import MAX_JOB_ID, PROGRESS_PREFIX, has_state_key

RULE = (
    f"at most {MAX_JOB_ID} letters, digits and - _ = / ., with no empty part between dots (not '', '.a', 'a.', 'a..b'), "
    f"not starting {PROGRESS_PREFIX!r} (a job's progress key)"
)


def job_id_problem(job: str) -> str | None:
    """Why ``job`` cannot name a job (None: it can)."""
    if has_state_key(job):
        return None
    return f"invalid job id {job[:100]!r}: {RULE}"


def new_job_id_problem(job: str) -> str | None:
    """Why ``job`` cannot name a new job (None: it can): ``job_id_problem``'s rule, and no ``/``."""
    if "/" in job:
        return (
            f"invalid job id {job[:100]!r}: no '/' in a job id (a job is read at /v1/jobs/ID and "
            "/v1/jobs/ID/results, where a '/' would end the id)"
        )
    return job_id_problem(job)
