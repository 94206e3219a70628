"""Waiting out a server that is away: one backoff for the fabric's retry loops.

``Backoff(first, most)`` gives the pauses between tries: doubling from ``first`` to ``most`` seconds,
each drawn between half and all of that (without jitter, every process that lost the same server
would try again in step; with full jitter, pauses bunch near zero). ``retry_transient`` calls
``call()`` again while it fails with an error that waiting may cure (``transient``: a NATS call's), for
up to ``patience`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

log = logging.getLogger("embedfleet.retry")

T = TypeVar("T")


class Backoff:
    def __init__(self, first: float, most: float) -> None:
        self._first, self._most = first, most
        self._delay = first

    def next(self) -> float:
        """The pause before the next try (seconds), and the one after it doubled."""
        pause = self._delay * random.uniform(0.5, 1.0)
        self._delay = min(self._delay * 2, self._most)
        return pause


async def retry_transient(
    call: Callable[[], Awaitable[T]],
    transient: Callable[[BaseException], bool],
    patience: float,
    what: str,
    first: float = 0.25,
    most: float = 2.0,
) -> T:
    """``await call()``, tried again after a pause while it raises an error for which ``transient`` is
    true (a lost connection, a timeout), for up to ``patience`` seconds; then that error is raised."""
    from nats.errors import Error as NatsError

    give_up = time.monotonic() + patience
    backoff = Backoff(first, most)
    while True:
        try:
            return await call()
        except (TimeoutError, NatsError) as exc:
            if not transient(exc) or time.monotonic() > give_up:
                raise
            log.debug("%s waits for the server: %r", what, exc)
            await asyncio.sleep(backoff.next())


def transient(exc: BaseException) -> bool:
    """A lost connection, a timeout or JetStream not ready yet: worth trying again. An API error that
    the server answered (a bad request, a limit) is not."""
    from nats.js.errors import APIError, ServiceUnavailableError

    return not isinstance(exc, APIError) or isinstance(exc, ServiceUnavailableError)
