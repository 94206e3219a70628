"""GET /v1/jobs: the jobs the caller may see, newest first, a page at a time, in the shape of OpenAI's
batches list (``{"object": "list", "data", "first_id", "last_id", "has_more"}``).

The order is by when a job was first submitted (its record's ``started``), newest first, ties by id
(the greater first): a total order, so a cursor (``after``: the last id of the page before) names one
place in it, and a job submitted between two pages' requests comes first and shifts nothing after it.
A job's record says who may see it (owners.py); ``status`` keeps one state's jobs.

The bucket has no index by time: a page is the newest ``limit`` of every record the caller may see,
read once through shared/jobs/listing.py (a fetch of records at a time). A request holds one fetch and
the page (``limit`` + 1 records decoded whole), never the bucket; its work grows with the records the
bucket keeps (``--job-ttl``): each one's JSON parsed once, ``MAX_LISTED`` records at most.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping
from functools import partial

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from embedfleet.services.gateway.http.body_errors import fault_error
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.jobs.answers import Status
from embedfleet.services.gateway.jobs.owners import JobOwners
from embedfleet.services.gateway.response_parts import omitted
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.jobs.bucket import read_state, with_progress
from embedfleet.shared.jobs.claims import owner_holds
from embedfleet.shared.jobs.ids import job_id_problem
from embedfleet.shared.jobs.listing import RecordsLost, TooManyRecords, bucket_records, listed
from embedfleet.shared.jobs.state import RUNNING, STALLED, JobState, JobStateError
from embedfleet.shared.nats.subjects import Subjects

log = logging.getLogger("embedfleet.gateway.jobs")

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
# records a listing reads at most: a bucket holding more is refused (503) before any is read. Reading
# costs ~0.2 ms a record (nats-py's per-message work; docs/bulk-jobs.md), so ~4 s at the bound
MAX_LISTED = 20_000

Place = tuple[float, str]  # a job's place in the order: (started, id), the greatest first


class JobListQuery(BaseModel):
    """GET /v1/jobs' query parameters; they also make its /openapi.json parameters. Other parameters
    are ignored."""

    # lax: a query's values are strings ("5" is the limit 5)
    model_config = ConfigDict(frozen=True, extra="ignore")

    limit: int = Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description=f"jobs a page, 1 to {MAX_LIMIT}")
    after: str = omitted(
        "a cursor: the last id of the page before (its last_id); the page starts after that job. "
        "A job that is not there, or not the caller's: 400"
    )
    status: Status = omitted("only the jobs in this state")


def parse_listing(params: Mapping[str, str]) -> JobListQuery:
    """The query of GET /v1/jobs; ApiError (400 naming the parameter) for a bad one."""
    try:
        query = JobListQuery.model_validate(dict(params))
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        if err["type"] == "int_parsing":  # a query's value is a string: say what it should be
            name = str(err["loc"][0])
            raise ApiError(
                ErrorCode.INVALID_REQUEST, f"'{name}' must be an integer, got {err['input'][:32]!r}", name
            ) from None
        raise fault_error(exc.errors(include_url=False)) from None
    if query.after is not None and (problem := job_id_problem(query.after)):
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'after': {problem}", "after")
    return query


def place_of(state: JobState) -> Place:
    return (state.started or 0.0, state.job)


async def job_page(
    records: AsyncIterable[tuple[str, bytes]],
    query: JobListQuery,
    sees: Callable[[str | None], bool],
    after: Place | None = None,
    progress: Callable[[JobState], Awaitable[JobState]] | None = None,
) -> tuple[list[JobState], bool]:
    """The page of ``records`` (job id, record) that ``query`` asks for, newest first, and whether more
    follow it: of the submitted jobs whose owner ``sees`` passes (and in ``query``'s status), the
    ``limit`` next after the place ``after`` (None: from the newest). A record this code did not write
    is left out (logged). ``progress``: a record's state with its job's progress (shared/jobs/bucket.py),
    which may have settled a running job: read for a running record when ``query`` asks for a status,
    and for each job of the page."""
    kept: list[tuple[Place, JobState]] = []  # a min-heap of the newest limit + 1 found so far
    for_more = query.limit + 1
    async for job, data in records:
        entry = listed(data, job)
        if entry is None or not sees(entry.owner):
            continue
        settles = progress is not None and entry.status in (RUNNING, STALLED)  # its progress may say done
        if query.status is not None and entry.status != query.status and not settles:
            continue
        place = (entry.started, job)
        if (after is not None and place >= after) or (len(kept) == for_more and place <= kept[0][0]):
            continue
        try:
            state = JobState.decode(data, job)
            if settles and query.status is not None:
                assert progress is not None  # settles says so
                state = await progress(state)
                if state.status != query.status:
                    continue
        except JobStateError as exc:
            log.warning("%s: not listed", exc)
            continue
        if len(kept) == for_more:
            heapq.heapreplace(kept, (place, state))
        else:
            heapq.heappush(kept, (place, state))
    newest = [state for _, state in sorted(kept, key=lambda k: k[0], reverse=True)]
    page = newest[: query.limit]
    if progress is not None:  # the counts of each (a record's own are not the job's once it has progress)
        page = [await progress(state) for state in page]
    return page, len(newest) > query.limit


async def read_page(js, kv, subjects: Subjects, owners: JobOwners, query: JobListQuery) -> tuple[list[JobState], bool]:
    """The page ``query`` asks for of the job bucket's records, as ``owners`` lets the caller see them
    (job_page); an 'after' that names no job the caller sees is refused (400), as a cursor that places
    nothing; a bucket past ``MAX_LISTED``, or one that stops answering, 503."""
    after = None
    if query.after is not None:
        cursor = await read_state(kv, query.after)
        if cursor is None or not cursor.submitted or not owners.sees(cursor):
            raise ApiError(ErrorCode.INVALID_REQUEST, f"'after': no job {query.after!r} to list after", "after")
        after = place_of(cursor)
    try:
        async with contextlib.aclosing(bucket_records(js, subjects, MAX_LISTED)) as records:
            states, more = await job_page(records, query, owners.sees_owner, after, partial(_with_progress, kv))
        if owners.private:  # a record whose owner was rewritten is listed to no key (shared/jobs/claims.py)
            states = [state for state in states if await owner_holds(js, subjects, state)]
        return states, more
    except RecordsLost as exc:
        raise ApiError(ErrorCode.NO_RESPONDERS, f"{exc}: try again") from None
    except TooManyRecords as exc:
        raise ApiError(
            ErrorCode.NO_RESPONDERS,
            f"{exc}: records expire after the --job-ttl, `embedfleet jobs purge JOB` removes one, "
            "`embedfleet jobs` lists them all",
        ) from None


async def _with_progress(kv, state: JobState) -> JobState:
    try:
        return await with_progress(kv, state, state.job) or state
    except JobStateError as exc:  # a progress this code did not write: the record's own counts
        log.warning("%s: listed without it", exc)
        return state


def page_answer(data: list[dict], has_more: bool) -> dict:
    """A page's answer (job_answers.JobList): ``data`` each job as GET /v1/jobs/{id} shows it."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }
