"""The bulk jobs' routes' work: POST /v1/jobs (a job checked against what the fleet serves, then submitted),
GET /v1/jobs (a page of the caller's), GET /v1/jobs/{id} (its state), DELETE /v1/jobs/{id} (cancelled) and
GET /v1/jobs/{id}/results (its vectors streamed), typed against ``JobsHost``: what they need of the gateway.

Jobs live in JetStream: where the NATS server offers none, the gateway has no job manager and these routes
answer 503 (``NO_JETSTREAM``), the online routes being served all the same."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from starlette.responses import Response

from embedfleet.services.gateway.core import Fleet, offers
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.http.formats import json_response
from embedfleet.services.gateway.jobs.api import JobsApi, check_job_id, parse_job
from embedfleet.services.gateway.jobs.listing import JobListQuery
from embedfleet.services.gateway.jobs.results import JobResultsApi
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.nats.embed_client import EmbedClient

NO_JETSTREAM = "bulk jobs need JetStream, which this NATS server does not offer"

T = TypeVar("T")


class JobsHost(Fleet, Protocol):
    """What the job routes need of the gateway besides the fleet's view and a request's model."""

    @property
    def jobs(self) -> JobsApi | None:
        """The jobs' manager: submits, lists, reads and cancels them (None: NATS offers no JetStream)."""
        ...

    @property
    def job_results(self) -> JobResultsApi | None:
        """The reader of a finished job's vectors (None: NATS offers no JetStream)."""
        ...

    @property
    def client(self) -> EmbedClient:
        """The fleet's client: a tokenizer it asks says whether a chunked job's windows fit the model."""
        ...

    @property
    def max_payload(self) -> int:
        """The NATS server's message limit (bytes), which a job's batches are cut to fit."""
        ...


def _served(part: T | None) -> T:
    """``part`` of the jobs' machinery; ApiError 503 when there is none (no JetStream)."""
    if part is None:
        raise ApiError(ErrorCode.NO_RESPONDERS, NO_JETSTREAM)
    return part


async def create(host: JobsHost, read_body: Callable[[], Awaitable[bytes]]) -> Response:
    """POST /v1/jobs; the body (``read_body``) is read only once jobs are known to be served."""
    jobs = _served(host.jobs)
    doc = parse_job(await read_body())
    model = await host.resolve_model(doc.model)
    if doc.output in ("sparse", "multivector") and doc.output not in await offers(host, model):
        raise ApiError(ErrorCode.INVALID_REQUEST, f"{model} makes no {doc.output} vectors", "output")
    status, answer = await jobs.create(doc, model, await host.view(), host.max_payload, host.client)
    return json_response(answer, status=status)


async def page(host: JobsHost, query: JobListQuery) -> Response:
    """GET /v1/jobs: ``query`` is parse_listing's (a bad query is a 400 even without JetStream)."""
    return json_response(await _served(host.jobs).page(query))


async def state(host: JobsHost, job: object) -> Response:
    """GET /v1/jobs/{id}: ``job`` is the path's id, checked once jobs are known to be served."""
    jobs = _served(host.jobs)
    return json_response(await jobs.get(check_job_id(job)))


async def results(host: JobsHost, job: object, accept: str | None) -> Response:
    """GET /v1/jobs/{id}/results, in the form ``accept`` asks for (services/gateway/jobs/results.py)."""
    reader = _served(host.job_results)
    return await reader.response(check_job_id(job), accept)


async def cancel(host: JobsHost, job: object) -> Response:
    """DELETE /v1/jobs/{id}: the job cancelled, its state as it stands after."""
    jobs = _served(host.jobs)
    return json_response(await jobs.cancel(check_job_id(job)))
