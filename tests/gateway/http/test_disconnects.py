"""A request told by the HTTP server that its client left: its handling, in the request's own task, is
cancelled, the cancellation ends there (the task goes on to count and log it), and any other
cancellation goes on up."""

from __future__ import annotations

import asyncio

import pytest

from embedfleet.services.gateway.http.disconnects import Departure, run_departing


async def _request(app, departure: Departure, leave_after: float | None) -> tuple[bool, bool]:
    """Whether run_departing said the client left, and whether the task is free of cancellation after it."""
    loop = asyncio.get_running_loop()
    if leave_after is not None:
        loop.call_later(leave_after, departure.leave)
    gone = await run_departing(app, {"type": "http"}, None, None, departure)
    await asyncio.sleep(0.01)  # the task goes on (to count and log the request)
    return gone, asyncio.current_task().cancelling() == 0


async def _slow(scope, receive, send) -> None:
    await asyncio.sleep(30)


async def _quick(scope, receive, send) -> None:
    await asyncio.sleep(0)


def test_a_client_leaving_cancels_the_handling_and_only_it():
    departure = Departure()
    started = asyncio.run(asyncio.wait_for(_request(_slow, departure, 0.05), 5))
    assert started == (True, True)


def test_an_answered_request_is_not_gone_and_a_late_departure_is_ignored():
    departure = Departure()

    async def run() -> tuple[bool, bool]:
        result = await _request(_quick, departure, None)
        departure.leave()  # the connection closes after the answer: nothing to cancel
        await asyncio.sleep(0.01)
        return result

    assert asyncio.run(run()) == (False, True)


def test_another_cancellation_goes_on_up():
    async def run() -> None:
        task = asyncio.create_task(run_departing(_slow, {"type": "http"}, None, None, Departure()))
        await asyncio.sleep(0.05)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(run())
