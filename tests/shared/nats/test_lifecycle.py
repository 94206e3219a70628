"""Connecting to NATS: a stop ends the wait at once, whatever the connecting code does with a cancel."""

from __future__ import annotations

import asyncio

import pytest

from embedfleet.shared.nats.lifecycle import ConnectAborted, unless_stopped


async def _loses_the_first_cancel() -> None:
    """What nats-py's retrying of a refused connection does when the cancel lands just as an attempt
    fails: Python 3.11's asyncio.wait_for (its TCP connect) raises the failure instead of the cancel,
    nats-py's loop catches it as any failed attempt and tries again."""
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        pass
    await asyncio.sleep(3600)


def test_a_stop_ends_the_wait_even_when_the_work_loses_a_cancel():
    async def main() -> None:
        stop = asyncio.Event()
        waiting = asyncio.ensure_future(unless_stopped(_loses_the_first_cancel(), stop))
        await asyncio.sleep(0.05)
        stop.set()
        done, _ = await asyncio.wait({waiting}, timeout=3)
        assert waiting in done, "still waiting for the work 3 s after the stop"
        with pytest.raises(ConnectAborted):
            waiting.result()

    asyncio.run(main())


def test_work_that_finishes_first_gives_its_result():
    async def main() -> None:
        assert await unless_stopped(asyncio.sleep(0, "answered"), asyncio.Event()) == "answered"

    asyncio.run(main())
