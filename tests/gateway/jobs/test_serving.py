"""The job routes' work (services/gateway/jobs/serving.py) where NATS offers no JetStream: every route a 503,
said before the body is read or the job's id checked; with jobs served, the id is checked."""

from __future__ import annotations

import asyncio

import pytest

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.jobs import serving
from embedfleet.services.gateway.jobs.listing import parse_listing
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.nats.fleet import FleetView


class _Host:
    """A gateway whose jobs' manager and results reader are ``jobs`` (None: no JetStream)."""

    def __init__(self, jobs: object | None) -> None:
        self.jobs = jobs
        self.job_results = jobs
        self.client = None
        self.max_payload = 1 << 20

    async def view(self) -> FleetView:
        raise AssertionError("the fleet is not asked")

    async def resolve_model(self, requested: str | None) -> str:
        raise AssertionError("no model is resolved")


class _Jobs:
    """A jobs' manager and results reader that no request with a bad id reaches."""

    async def get(self, job: str) -> dict:
        raise AssertionError("a bad id reaches no job")

    cancel = get

    async def response(self, job: str, accept: str | None) -> None:
        raise AssertionError("a bad id reaches no job")


async def _unread() -> bytes:
    raise AssertionError("the body is not read")


ROUTES = {
    "create": lambda host: serving.create(host, _unread),
    "page": lambda host: serving.page(host, parse_listing({})),
    "state": lambda host: serving.state(host, "a/b"),
    "results": lambda host: serving.results(host, "a/b", None),
    "cancel": lambda host: serving.cancel(host, "a/b"),
}


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_without_jetstream_every_route_is_unavailable(route):
    with pytest.raises(ApiError) as err:
        asyncio.run(ROUTES[route](_Host(None)))
    assert err.value.code is ErrorCode.NO_RESPONDERS
    assert err.value.message == serving.NO_JETSTREAM
    assert err.value.param is None


@pytest.mark.parametrize("route", ["state", "results", "cancel"])
def test_with_jobs_served_the_id_is_checked(route):
    with pytest.raises(ApiError) as err:
        asyncio.run(ROUTES[route](_Host(_Jobs())))
    assert err.value.code is ErrorCode.INVALID_REQUEST
    assert err.value.param == "id"
