"""Waiting in tests: for an event, by polling a condition until a deadline, never by sleeping blind.

A test that waits a fixed time passes on a fast machine and fails on a loaded one (or proves nothing
when the event came late); one that polls returns as soon as the event happened and, past its
deadline, fails saying what did not happen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, every: float = 0.1) -> None:
    """Return once ``predicate()`` is true; past ``timeout`` seconds fail with ``what`` (what did not happen)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


async def eventually(
    predicate: Callable[[], Awaitable[bool] | bool], timeout: float, what: str, every: float = 0.05
) -> None:
    """``wait_until`` inside an event loop: ``predicate`` may be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        done = predicate()
        if asyncio.iscoroutine(done):
            done = await done
        if done:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(every)
