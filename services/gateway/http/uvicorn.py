"""uvicorn's server, its housekeeping tick once a second instead of ten times a second.

uvicorn's main loop wakes every 0.1 s to see whether it should stop, and every tenth tick renews the
Date header (whole seconds). An idle gateway woke ten times a second for that. Here the loop wakes
once a second, which is all the Date header needs, and a signal to stop wakes it at once, so a
SIGTERM's graceful shutdown starts as soon as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from types import FrameType

import uvicorn

TICK = 1.0  # seconds between two looks at the server's state (the Date header's resolution)
_STARTUP_FAILURE = 3  # uvicorn.run's exit status when the server did not start


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._woken: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._loop, self._woken = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000  # uvicorn renews the Date header on each tenth of its ticks
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._woken.wait(), TICK)
            should_exit = await self.on_tick(counter)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None and self._woken is not None:
            # a signal handler interrupts the loop's own thread: hand the wake-up over through the loop
            self._loop.call_soon_threadsafe(self._woken.set)


def run(config: uvicorn.Config) -> None:
    """Serve ``config`` as uvicorn.run does for one process without reload."""
    config.load_app()
    server = Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        sys.exit(_STARTUP_FAILURE)
