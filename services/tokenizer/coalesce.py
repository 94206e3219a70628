"""Requests handled in groups of what is already waiting: no timer, a lone request goes alone at once.

nats-py runs a subscription's callback once per message, and hands over every message it has queued
in one go when the callback does not yield. ``put`` (the callback) only queues the message and wakes
one task; that task, running next, takes everything queued by then as one group. A group costs one
pass into the tokenizer, one delivery check per subject and one socket write for all its requests.
Past ``MAX_QUEUED`` messages or ``MAX_BYTES`` the callback waits for the group to be taken: the
messages then wait in nats-py's own queue, whose slow-consumer limits apply as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg

from embedfleet.shared.nats.bundles import Entry

log = logging.getLogger("embedfleet.tokenizer")

MAX_QUEUED = 256  # messages in one group at most
MAX_BYTES = 8 << 20  # their payloads together


class Coalescer:
    """``handle(msgs)`` is called with every message queued since its last call, one call at a time.
    A message is a NATS message, or a request that came in a Requests message (an Entry)."""

    def __init__(self, handle: Callable[[list[Msg | Entry]], Awaitable[None]]) -> None:
        self._handle = handle
        self._queued: deque[Msg | Entry] = deque()
        self._bytes = 0
        self._wake = asyncio.Event()
        self._taken = asyncio.Event()  # set when a group has been taken: a full queue has room again
        self._idle = asyncio.Event()  # set while nothing is queued or being handled
        self._idle.set()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def put(self, msg: Msg | Entry) -> None:
        self._queued.append(msg)
        self._bytes += len(msg.data)
        self._idle.clear()
        self._wake.set()
        while len(self._queued) >= MAX_QUEUED or self._bytes >= MAX_BYTES:
            self._taken.clear()
            await self._taken.wait()

    async def stop(self) -> None:
        """Handle everything queued, then end the task (call once the subscription has drained)."""
        if self._task is None:
            return
        await self._idle.wait()
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        self._task = None

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queued:
                group = self._take()
                try:
                    await self._handle(group)
                except Exception:  # the handler answers its own errors: this is a bug, logged, not fatal
                    log.exception("handling %d requests failed", len(group))
            self._idle.set()

    def _take(self) -> list[Msg | Entry]:
        group: list[Msg | Entry] = []
        while self._queued and len(group) < MAX_QUEUED:
            group.append(self._queued.popleft())
        self._bytes -= sum(len(m.data) for m in group)
        self._taken.set()
        return group
