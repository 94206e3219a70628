"""Who serves what right now, and who just died: learnt from NATS micro-service pings ($SRV.PING).

A ``FleetWatch`` pings the tokenizers and workers under our subject prefix every ``interval``
seconds in the background, so a request never waits for a poll. While the caller is idle (nothing in
flight, no request since the last poll) it pings every ``IDLE_POLLS`` intervals instead, and the
first request that goes out brings the next ping forward (no sooner than ``interval`` after the last):
the view a request reads is the same, the fleet is woken a fifth as often. Each live process answers
with its instance id. A process that dies is found two ways, and the watch calls its ``on_lost``
callbacks: callers re-send the work that process may have held.

- Within ``LIVENESS_INTERVAL`` while the caller has work in flight (``busy()``; idle, the checks sleep
  until a request goes out, which asks ``workers()``): every known process
  is sent an empty message on its own ping subject (``$SRV.PING.<name>.<id>``) with a reply to our
  inbox. nats-server answers such a message at once with a 503 status when nobody subscribes to the
  subject: the process's connection closed (SIGKILL, a crash, the OOM killer). A live process answers
  the ping; that answer is ignored.
- A process not heard from for ``LOST_AFTER_POLLS`` intervals (and a ping's wait) and that missed the
  last ``LOST_AFTER_POLLS`` background pings: a stopped process (SIGSTOP) or a host cut off, whose
  connection is still open. (While idle, that is three idle pings: one ping missed is never enough.)

A worker taken for lost by its silence may still look live to a tokenizer (its last load report
not stale yet: three of the intervals it announced, seconds for an idle worker): for ``SILENCED_FOR``
seconds, or until it answers a ping again, ``silenced(model)`` names it, and requests ask the tokenizers
to pass it over (EmbedRequest.avoid), the rows sent again included.

A worker that stops cleanly drains its work first and says so in its last load report, also sent on
the leaving subject: it is forgotten without a call. (A tokenizer holds a request for milliseconds;
one that stops cleanly costs at most duplicates, which callers ignore.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from nats.aio.client import Client

from embedfleet.shared.nats.lifecycle import cancel
from embedfleet.shared.nats.subjects import SERVICE_NAMES, Subjects, model_token
from embedfleet.shared.protocol import MAX_AVOID, LoadReport, ProtocolError, decode_as

log = logging.getLogger("embedfleet.fleet")
# polls a live process may miss (a reply lost in a reconnect, a busy event loop) before it is taken
# for dead; --discovery-interval's help states this count
LOST_AFTER_POLLS = 3
# seconds between liveness checks of the known processes while work is in flight: how soon the work
# a killed process held is sent again
LIVENESS_INTERVAL = 0.2
# intervals between background pings while the caller is idle; --discovery-interval's help states it
IDLE_POLLS = 5
# seconds between pings while a caller waits for a model to be served again (``wait_serving``)
WAITING_POLL = 0.3
_NO_RESPONDERS = "503"
# seconds a worker taken for lost by its silence is named to the tokenizers: they drop it themselves once
# its load reports are stale (three of the intervals it announced: 6 s at the default idle interval)
SILENCED_FOR = 60.0


@dataclass(frozen=True, slots=True)
class Member:
    """One live process as the last pings saw it."""

    model: str
    ping: str  # its own ping subject: $SRV.PING.<name>.<micro-service id>
    seen: float  # monotonic time of its last answer
    metadata: dict[str, str]  # what it said of itself then


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

    def without(self, role: str, model: str) -> FleetView:
        """This view less ``role``'s entry for ``model`` (its last process of that role died)."""
        tokenizers, workers = dict(self.tokenizers), dict(self.workers)
        (tokenizers if role == "tokenizer" else workers).pop(model, None)
        return FleetView(tokenizers, workers, self.at)


class FleetWatch:
    """``busy()``: whether the caller has work in flight (the liveness checks run only then)."""

    def __init__(
        self, nc: Client, prefix: str, wait: float, interval: float, busy: Callable[[], bool] = lambda: True
    ) -> None:
        self._nc = nc
        self._prefix = prefix  # only services under our subject prefix belong to our fleet
        self._wait = wait
        self._interval = interval
        self._lost_after = LOST_AFTER_POLLS * interval + wait  # seconds
        self._gap = interval  # seconds between background pings now (IDLE_POLLS intervals while idle)
        self._polls: deque[float] = deque(maxlen=LOST_AFTER_POLLS)  # monotonic starts of the last background pings
        self._view = FleetView({}, {}, 0.0)
        self._lock = asyncio.Lock()
        self._busy = busy
        self._seen: dict[tuple[str, str], Member] = {}
        self._left: set[str] = (
            set()
        )  # workers that said they are leaving (ids are never reused)  # (role, instance id) -> the process
        self._workers: dict[str, int] | None = None  # model -> its workers in _seen (None: to count again)
        # workers taken for lost by their silence: id -> (model, monotonic time), the latest MAX_AVOID
        self._silenced: dict[str, tuple[str, float]] = {}
        self._on_lost: list[Callable[[str, str, str], None]] = []
        self._request = asyncio.Event()  # a request went out (workers() was asked): the liveness checks wake
        self._asked = asyncio.Event()  # the same, for the background pings: an idle watch pings again soon
        self._tasks: list[asyncio.Task] = []
        self._subs: list = []
        self._live_inbox = ""

    def on_lost(self, callback: Callable[[str, str, str], None]) -> None:
        """Call ``callback(role, instance_id, model)`` when a live process dies or stops answering."""
        self._on_lost.append(callback)

    async def start(self) -> None:
        self._live_inbox = self._nc.new_inbox()
        self._subs = [
            await self._nc.subscribe(Subjects(self._prefix).leaving(), cb=self._on_leaving),
            await self._nc.subscribe(f"{self._live_inbox}.>", cb=self._on_liveness),
        ]
        self._tasks = [
            asyncio.create_task(self._poll_forever(), name="fleet-watch"),
            asyncio.create_task(self._check_liveness(), name="fleet-liveness"),
        ]

    async def _on_leaving(self, msg) -> None:
        try:
            report = decode_as(msg.data, LoadReport)
        except ProtocolError:
            return
        if report.leaving:
            self._seen.pop(("worker", report.id), None)  # its work drains: nothing to send again
            self._left.add(report.id)  # it answers pings while it drains: not taken back by a poll
            self._workers = None

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs = []
        for task in self._tasks:
            await cancel(task)
        self._tasks = []

    def serves(self, model: str) -> bool:
        """Whether the latest view has a tokenizer and a worker for ``model``."""
        return self._view.serves(model)

    def workers(self, model: str) -> int:
        """How many live workers of ``model`` the watch knows (asked per request: counted once per change).
        Being asked wakes the liveness checks, asleep while nothing was in flight, and brings an idle
        watch's next ping forward."""
        self._request.set()
        self._asked.set()
        if self._workers is None:
            self._workers = {}
            for (role, _), member in self._seen.items():
                if role == "worker":
                    self._workers[member.model] = self._workers.get(member.model, 0) + 1
        return self._workers.get(model, 0)

    def silenced(self, model: str) -> tuple[str, ...]:
        """The workers of ``model`` taken for lost by their silence within ``SILENCED_FOR`` seconds that have not
        answered a ping since: the tokenizers are asked to pass them over."""
        if not self._silenced:
            return ()
        oldest = time.monotonic() - SILENCED_FOR
        for instance in [i for i, (_, at) in self._silenced.items() if at < oldest]:
            del self._silenced[instance]
        return tuple(i for i, (m, _) in self._silenced.items() if m == model)

    async def view(self) -> FleetView:
        """The latest view; polled now only before the first poll, or when the background poll is late."""
        if time.monotonic() - self._view.at > 2 * self._gap + self._wait:
            async with self._lock:
                if time.monotonic() - self._view.at > 2 * self._gap + self._wait:
                    await self.refresh()
        return self._view

    async def wait_serving(self, model: str, since: float, until: float) -> bool:
        """Wait until a view taken after ``since`` (monotonic) has a tokenizer and a worker for ``model``:
        True then, False once ``until`` (monotonic) passes first. Pings every WAITING_POLL seconds meanwhile."""
        while True:
            view = self._view
            if view.at > since and self._heard_since(model, since):
                return True
            now = time.monotonic()
            if now >= until:
                return False
            # a ping gathers answers for `wait` seconds: none is started that would end past `until`
            if now - view.at >= WAITING_POLL and now + self._wait < until and not self._lock.locked():
                async with self._lock:  # one ping for every caller waiting
                    await self.refresh()
            else:
                await asyncio.sleep(min(0.05, until - now))

    def _heard_since(self, model: str, since: float) -> bool:
        """Whether a tokenizer and a worker of ``model`` answered a ping after ``since`` (monotonic)."""
        roles = {role for (role, _), m in self._seen.items() if m.model == model and m.seen > since}
        return roles == {"tokenizer", "worker"}

    async def refresh(self, until_ready: bool = False) -> FleetView:
        """Ping tokenizers and workers; ``until_ready`` returns as soon as the first of each answered when
        they serve one model, else after a full ping.

        The view holds what answered now and every process heard from within ``LOST_AFTER_POLLS``
        polls: a process too busy to answer one ping in time (a loaded event loop) still serves its
        model, and is taken for lost only as ``_check_lost`` says; while the NATS connection is down,
        only what answered counts (nothing)."""
        (tokenizers, t_ids), (workers, w_ids) = await asyncio.gather(
            self._ping("tokenizer", until_ready), self._ping("worker", until_ready)
        )
        now = time.monotonic()
        for role, ids in (("tokenizer", t_ids), ("worker", w_ids)):
            for instance, (model, ping, metadata) in ids.items():
                if not (role == "worker" and instance in self._left):
                    self._seen[(role, instance)] = Member(model, ping, now, metadata)
                    if role == "worker" and self._silenced:
                        self._silenced.pop(instance, None)  # it answers again (SIGCONT, the host back)
        for (role, _), member in self._seen.items() if self._nc.is_connected else ():  # NATS down: nothing serves
            if not self._silent(member, now):
                (tokenizers if role == "tokenizer" else workers).setdefault(member.model, member.metadata)
        self._view = FleetView(tokenizers, workers, now)
        self._workers = None
        if until_ready and not self._view.models:
            # the first tokenizer and the first worker to answer may serve different models: hear them all
            return await self.refresh()
        return self._view

    def _silent(self, member: Member, now: float) -> bool:
        """Whether ``member`` is taken for lost: not heard from for LOST_AFTER_POLLS intervals (and a ping's
        wait), nor since the first of the last LOST_AFTER_POLLS background pings began."""
        missed = len(self._polls) == LOST_AFTER_POLLS and member.seen < self._polls[0]
        return missed and now - member.seen > self._lost_after

    def _check_lost(self) -> None:
        now = time.monotonic()
        for (role, instance), member in list(self._seen.items()):
            if self._silent(member, now):
                if role == "worker":  # its connection open: a tokenizer may still route to it
                    self._silenced[instance] = (member.model, now)
                    while len(self._silenced) > MAX_AVOID:
                        del self._silenced[next(iter(self._silenced))]
                self._lost(role, instance, "stopped answering")

    def _lost(self, role: str, instance: str, why: str) -> None:
        member = self._seen.pop((role, instance), None)
        self._workers = None
        if member is None:
            return  # found already
        log.warning("%s %s %s: its work is sent again", role, instance, why)
        if not any(r == role and m.model == member.model for (r, _), m in self._seen.items()):
            self._view = self._view.without(role, member.model)  # its model's last of that role
        for callback in self._on_lost:
            try:
                callback(role, instance, member.model)
            except Exception:  # one failing callback must not stop the watch
                log.exception("fleet callback failed")

    async def _check_liveness(self) -> None:
        """While work is in flight, an empty message on each known process's own ping subject: the server
        answers 503 at once for one whose connection closed (``_on_liveness``). While nothing is in flight
        it sleeps until a request goes out (an idle caller wakes for nothing)."""
        while True:
            if not self._busy():
                self._request.clear()
                await self._request.wait()
                continue
            await asyncio.sleep(LIVENESS_INTERVAL)
            if not (self._busy() and self._nc.is_connected):
                continue
            try:
                for (role, instance), member in list(self._seen.items()):
                    await self._nc.publish(member.ping, b"", reply=f"{self._live_inbox}.{role}.{model_token(instance)}")
            except Exception as exc:  # lost in a reconnect: the next round checks again
                log.debug("liveness check: %s", exc)

    async def _on_liveness(self, msg) -> None:
        if not (msg.headers and msg.headers.get("Status") == _NO_RESPONDERS):
            return  # a live process's answer
        role, token = msg.subject[len(self._live_inbox) + 1 :].split(".", 1)
        for r, instance in list(self._seen):
            if r == role and model_token(instance) == token:
                self._lost(role, instance, "is gone (its connection closed)")

    async def _poll_forever(self) -> None:
        while True:
            started = time.monotonic()
            self._asked.clear()
            if self._nc.is_connected:
                try:
                    await self.refresh()
                    self._polls.append(started)
                    self._check_lost()
                except Exception as exc:  # a poll lost during a reconnect is replaced by the next one
                    log.debug("fleet poll: %s", exc)
            await self._until_next_poll(started)

    async def _until_next_poll(self, started: float) -> None:
        """Wait ``interval`` after the ping that began at ``started``; while idle, IDLE_POLLS intervals, or
        until a request goes out (but at least ``interval``)."""
        if self._busy() or self._asked.is_set():
            self._gap = self._interval
        else:
            self._gap = IDLE_POLLS * self._interval
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._asked.wait(), max(0.0, started + self._gap - time.monotonic()))
        await asyncio.sleep(max(0.0, started + self._interval - time.monotonic()))

    async def _ping(
        self, role: str, first_only: bool
    ) -> tuple[dict[str, dict[str, str]], dict[str, tuple[str, str, dict]]]:
        """Who of ``role`` answers: model -> one process's metadata; instance -> (model, its ping subject,
        its metadata)."""
        found: dict[str, dict[str, str]] = {}
        ids: dict[str, tuple[str, str, dict]] = {}
        name = SERVICE_NAMES[role]
        got_one = asyncio.Event()
        inbox = self._nc.new_inbox()

        async def on_reply(msg) -> None:
            try:
                answer = json.loads(msg.data)
                meta = answer.get("metadata") or {}
                service = answer.get("id")
                instance = meta.get("instance") or service
            except (ValueError, AttributeError):
                return
            if isinstance(meta, dict) and meta.get("prefix") == self._prefix and isinstance(meta.get("model"), str):
                found.setdefault(meta["model"], meta)
                if isinstance(instance, str) and isinstance(service, str) and service.isalnum():
                    ids[instance] = (meta["model"], f"$SRV.PING.{name}.{service}", meta)
                got_one.set()

        sub = await self._nc.subscribe(inbox, cb=on_reply)
        try:
            await self._nc.publish(f"$SRV.PING.{name}", b"", reply=inbox)
            if first_only:
                try:
                    await asyncio.wait_for(got_one.wait(), self._wait)
                except TimeoutError:
                    pass
            else:
                await asyncio.sleep(self._wait)
        finally:
            await sub.unsubscribe()
        return found, ids
