"""Which models the fleet serves right now, learnt from NATS micro-service pings ($SRV.PING)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass

from nats.aio.client import Client

from shared.subjects import SERVICE_NAMES

log = logging.getLogger("embedfleet.gateway.discovery")


@dataclass(frozen=True, slots=True)
class FleetView:
    tokenizers: dict[str, dict[str, str]]  # model id -> metadata of one live tokenizer
    workers: dict[str, dict[str, str]]  # model id -> metadata of one live worker
    at: float  # monotonic time of the poll

    @property
    def models(self) -> list[str]:
        """Models with at least one tokenizer and one worker."""
        return sorted(set(self.tokenizers) & set(self.workers))


class Discovery:
    def __init__(self, nc: Client, prefix: str, wait: float, interval: float) -> None:
        self._nc = nc
        self._prefix = prefix  # only services under our subject prefix belong to our fleet
        self._wait = wait
        self._interval = interval
        self._view = FleetView({}, {}, 0.0)
        self._lock = asyncio.Lock()

    async def view(self, max_age: float | None = None) -> FleetView:
        """The latest fleet view, polled again when older than ``max_age`` (default: the interval)."""
        max_age = self._interval if max_age is None else max_age
        if time.monotonic() - self._view.at > max_age:
            async with self._lock:
                if time.monotonic() - self._view.at > max_age:
                    await self.refresh()
        return self._view

    async def refresh(self, until_ready: bool = False) -> FleetView:
        """Ping tokenizers and workers; ``until_ready`` returns as soon as one model has both."""
        tokenizers, workers = await asyncio.gather(
            self._ping("tokenizer", until_ready), self._ping("worker", until_ready)
        )
        self._view = FleetView(tokenizers, workers, time.monotonic())
        return self._view

    async def _ping(self, role: str, first_only: bool) -> dict[str, dict[str, str]]:
        found: dict[str, dict[str, str]] = {}
        got_one = asyncio.Event()
        inbox = self._nc.new_inbox()

        async def on_reply(msg) -> None:
            try:
                meta = json.loads(msg.data).get("metadata") or {}
            except (ValueError, AttributeError):
                return
            if isinstance(meta, dict) and meta.get("prefix") == self._prefix and isinstance(meta.get("model"), str):
                found.setdefault(meta["model"], meta)
                got_one.set()

        sub = await self._nc.subscribe(inbox, cb=on_reply)
        try:
            await self._nc.publish(f"$SRV.PING.{SERVICE_NAMES[role]}", b"", reply=inbox)
            if first_only:
                try:
                    await asyncio.wait_for(got_one.wait(), self._wait)
                except asyncio.TimeoutError:
                    pass
            else:
                await asyncio.sleep(self._wait)
        finally:
            await sub.unsubscribe()
        return found
