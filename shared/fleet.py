"""Who serves what right now, and who just died: learnt from NATS micro-service pings ($SRV.PING).

A ``FleetWatch`` pings the tokenizers and workers under our subject prefix every ``interval``
seconds in the background, so a request never waits for a poll. Each live process answers with
its instance id; a process not heard from for ``LOST_AFTER_POLLS`` intervals (and a ping's wait)
has died (SIGKILL, a crashed host, a stopped process) and the watch calls its ``on_lost``
callbacks: callers re-send the work that process may have held. A worker that stops cleanly
drains its work first and says so in its last load report, also sent on the leaving subject: it is
forgotten without a call. (A tokenizer holds a request for milliseconds; one that stops cleanly
costs at most duplicates, which callers ignore.)
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Callable

from nats.aio.client import Client

from shared.lifecycle import cancel
from shared.protocol import LoadReport, ProtocolError, decode_as
from shared.subjects import SERVICE_NAMES, Subjects

log = logging.getLogger("embedfleet.fleet")
# polls a live process may miss (a reply lost in a reconnect, a busy event loop) before it is taken
# for dead; --discovery-interval's help states this count
LOST_AFTER_POLLS = 3


@dataclass(frozen=True, slots=True)
class FleetView:
    tokenizers: dict[str, dict[str, str]]  # model id -> metadata of one live tokenizer
    workers: dict[str, dict[str, str]]  # model id -> metadata of one live worker
    at: float  # monotonic time of the poll

    @property
    def models(self) -> list[str]:
        """Models with at least one tokenizer and one worker."""
        return sorted(set(self.tokenizers) & set(self.workers))

    def serves(self, model: str) -> bool:
        return model in self.tokenizers and model in self.workers


class FleetWatch:
    def __init__(self, nc: Client, prefix: str, wait: float, interval: float) -> None:
        self._nc = nc
        self._prefix = prefix  # only services under our subject prefix belong to our fleet
        self._wait = wait
        self._interval = interval
        self._lost_after = LOST_AFTER_POLLS * interval + wait  # seconds
        self._view = FleetView({}, {}, 0.0)
        self._lock = asyncio.Lock()
        self._seen: dict[tuple[str, str], float] = {}  # (role, instance id) -> last answer (monotonic)
        self._on_lost: list[Callable[[str, str], None]] = []
        self._task: asyncio.Task | None = None
        self._leaving_sub = None

    def on_lost(self, callback: Callable[[str, str], None]) -> None:
        """Call ``callback(role, instance_id)`` when a live process stops answering."""
        self._on_lost.append(callback)

    async def start(self) -> None:
        self._leaving_sub = await self._nc.subscribe(Subjects(self._prefix).leaving(), cb=self._on_leaving)
        self._task = asyncio.create_task(self._poll_forever(), name="fleet-watch")

    async def _on_leaving(self, msg) -> None:
        try:
            report = decode_as(msg.data, LoadReport)
        except ProtocolError:
            return
        if report.leaving:
            self._seen.pop(("worker", report.id), None)

    async def stop(self) -> None:
        if self._leaving_sub is not None:
            await self._leaving_sub.unsubscribe()
            self._leaving_sub = None
        await cancel(self._task)
        self._task = None

    def serves(self, model: str) -> bool:
        """Whether the latest view has a tokenizer and a worker for ``model``."""
        return self._view.serves(model)

    async def view(self) -> FleetView:
        """The latest view; polled now only before the first poll, or when the background poll is late."""
        if time.monotonic() - self._view.at > 2 * self._interval + self._wait:
            async with self._lock:
                if time.monotonic() - self._view.at > 2 * self._interval + self._wait:
                    await self.refresh()
        return self._view

    async def refresh(self, until_ready: bool = False) -> FleetView:
        """Ping tokenizers and workers; ``until_ready`` returns as soon as one model has both."""
        (tokenizers, t_ids), (workers, w_ids) = await asyncio.gather(
            self._ping("tokenizer", until_ready), self._ping("worker", until_ready)
        )
        now = time.monotonic()
        self._view = FleetView(tokenizers, workers, now)
        for role, ids in (("tokenizer", t_ids), ("worker", w_ids)):
            for instance in ids:
                self._seen[(role, instance)] = now
        return self._view

    def _check_lost(self) -> None:
        now = time.monotonic()
        for key, seen in list(self._seen.items()):
            if now - seen > self._lost_after:
                del self._seen[key]
                role, instance = key
                log.warning("%s %s stopped answering: its work is sent again", role, instance)
                for callback in self._on_lost:
                    try:
                        callback(role, instance)
                    except Exception:  # one failing callback must not stop the watch
                        log.exception("fleet callback failed")

    async def _poll_forever(self) -> None:
        while True:
            started = time.monotonic()
            if self._nc.is_connected:
                try:
                    await self.refresh()
                    self._check_lost()
                except Exception as exc:  # a poll lost during a reconnect is replaced by the next one
                    log.debug("fleet poll: %s", exc)
            await asyncio.sleep(max(0.0, self._interval - (time.monotonic() - started)))

    async def _ping(self, role: str, first_only: bool) -> tuple[dict[str, dict[str, str]], set[str]]:
        found: dict[str, dict[str, str]] = {}
        ids: set[str] = set()
        got_one = asyncio.Event()
        inbox = self._nc.new_inbox()

        async def on_reply(msg) -> None:
            try:
                answer = json.loads(msg.data)
                meta = answer.get("metadata") or {}
                instance = meta.get("instance") or answer.get("id")
            except (ValueError, AttributeError):
                return
            if isinstance(meta, dict) and meta.get("prefix") == self._prefix and isinstance(meta.get("model"), str):
                found.setdefault(meta["model"], meta)
                if isinstance(instance, str):
                    ids.add(instance)
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
        return found, ids
