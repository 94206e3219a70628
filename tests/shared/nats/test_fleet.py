"""FleetWatch on a real nats-server: a process whose connection closes is found within the liveness
interval, while work is in flight, and only then; callers waiting for a model see it served again; the
embed client asks for Held replies only while the watch knows several workers of the model, and names the
workers taken for stopped for the tokenizers to pass over."""

from __future__ import annotations

import asyncio
import json
import time

import nats
import pytest

from embedfleet.shared.errors import ServiceError
from embedfleet.shared.nats.embed_client import EmbedClient
from embedfleet.shared.nats.fleet import IDLE_POLLS, LIVENESS_INTERVAL, LOST_AFTER_POLLS, FleetWatch
from embedfleet.shared.nats.lifecycle import register
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import EmbedOptions, EmbedRequest, Held, decode_as, encode

PREFIX = "fleettest"


async def _member(url: str, role: str, instance: str, prefix: str = PREFIX) -> nats.NATS:
    """A connection registered as a ``role`` process of model "m" under ``prefix``."""
    nc = await nats.connect(url)
    await register(nc, Subjects(prefix), role, "test", {"model": "m", "instance": instance})
    return nc


async def _watched_client(
    url: str, prefix: str, wait: float, interval: float
) -> tuple[nats.NATS, FleetWatch, EmbedClient]:
    """A connection, a FleetWatch on it busy while the EmbedClient on it has requests in flight, and that client."""
    watcher = await nats.connect(url)
    client: EmbedClient | None = None
    watch = FleetWatch(
        watcher, prefix, wait=wait, interval=interval, busy=lambda: client is not None and client.in_flight > 0
    )
    client = EmbedClient(watcher, Subjects(prefix), fleet=watch)
    return watcher, watch, client


async def _lost_after_close(url: str, busy: bool) -> tuple[list[tuple], float]:
    watcher = await nats.connect(url)
    # polls too rare to matter: only the liveness check can find the loss in time
    watch = FleetWatch(watcher, PREFIX, wait=0.2, interval=60, busy=lambda: busy)
    lost: list[tuple] = []
    watch.on_lost(lambda *who: lost.append((time.monotonic(), who)))
    members = [await _member(url, "tokenizer", "t1"), await _member(url, "worker", "w1")]
    try:
        await watch.start()
        began = time.monotonic()
        await watch.refresh()
        while not watch.serves("m") and time.monotonic() - began < 10:  # a loaded machine may miss a wait
            await watch.refresh()
        assert watch.serves("m")
        closed = time.monotonic()
        await members[1].close()  # what the server sees of a SIGKILL: the connection ends
        while not lost and time.monotonic() - closed < 5 * LIVENESS_INTERVAL:
            await asyncio.sleep(0.01)
        return lost, closed
    finally:
        await watch.stop()
        for nc in [watcher, *members]:
            await nc.close()


def test_a_closed_connection_is_lost_within_the_liveness_interval(nats_url):
    lost, closed = asyncio.run(_lost_after_close(nats_url, busy=True))
    assert [who for _, who in lost] == [("worker", "w1", "m")]
    assert lost[0][0] - closed < 2 * LIVENESS_INTERVAL + 0.1


def test_nothing_is_checked_while_no_work_is_in_flight(nats_url):
    lost, _ = asyncio.run(_lost_after_close(nats_url, busy=False))
    assert lost == []


def test_waiting_for_a_model_sees_a_process_come_back(nats_url):
    async def run() -> tuple[bool, bool, float]:
        watcher = await nats.connect(nats_url)
        watch = FleetWatch(watcher, PREFIX + "2", wait=0.1, interval=60)
        tokenizer = await nats.connect(nats_url)
        await register(tokenizer, Subjects(PREFIX + "2"), "tokenizer", "test", {"model": "m", "instance": "t"})
        worker = await nats.connect(nats_url)
        try:
            await watch.start()
            since = time.monotonic()
            # no worker: not served before the deadline
            early = await watch.wait_serving("m", since, since + 0.5)
            back = time.monotonic()
            await register(worker, Subjects(PREFIX + "2"), "worker", "test", {"model": "m", "instance": "w"})
            served = await watch.wait_serving("m", since, back + 5)
            return early, served, time.monotonic() - back
        finally:
            await watch.stop()
            for nc in (watcher, tokenizer, worker):
                await nc.close()

    early, served, took = asyncio.run(run())
    assert (early, served) == (False, True)
    assert took < 1.0  # a ping every WAITING_POLL (0.3 s) and its 0.1 s wait


async def _silent_worker(url: str, prefix: str, interval: float, asking: bool) -> tuple[bool, bool, float]:
    """A worker whose ping endpoint stops (its connection open): whether its model is still served after
    one missed ping, whether it is at the end, and how long after it fell silent it was taken for lost.
    ``asking``: requests keep going out (each asks how many workers serve the model), so the watch is not
    idle; none is in flight, so the liveness checks (which would find the stopped endpoint) stay asleep."""
    watcher = await nats.connect(url)
    watch = FleetWatch(watcher, prefix, wait=0.1, interval=interval, busy=lambda: False)
    tokenizer, worker = await nats.connect(url), await nats.connect(url)
    await register(tokenizer, Subjects(prefix), "tokenizer", "test", {"model": "m", "instance": "t"})
    service = await register(worker, Subjects(prefix), "worker", "test", {"model": "m", "instance": "w"})
    try:
        await watch.start()
        began = time.monotonic()
        while not watch.serves("m") and time.monotonic() - began < 10:  # a loaded machine may miss a 0.1 s wait
            await watch.refresh()
        assert watch.serves("m")
        await service.stop()  # answers no ping from now on
        silent = time.monotonic()
        await watch.refresh()
        still = watch.serves("m")  # one missed poll
        while watch.serves("m") and time.monotonic() - silent < 10 + 4 * IDLE_POLLS * interval:
            if asking:
                watch.workers("m")
            await asyncio.sleep(0.02)
        return still, watch.serves("m"), time.monotonic() - silent
    finally:
        await watch.stop()
        for nc in (watcher, tokenizer, worker):
            await nc.close()


def test_a_process_that_misses_a_ping_still_serves_until_it_is_taken_for_lost(nats_url):
    """A worker too busy to answer a poll in time (here: its ping endpoint stopped, its connection
    open) keeps its model served for LOST_AFTER_POLLS polls, not one: requests are not refused 503
    because an event loop was slow once."""
    still, later, took = asyncio.run(_silent_worker(nats_url, PREFIX + "3", 0.3, asking=True))
    assert still and not later
    assert LOST_AFTER_POLLS * 0.3 <= took < LOST_AFTER_POLLS * 0.3 + 2.0, took


def test_an_idle_watch_pings_less_often_and_takes_a_silent_process_for_lost_after_as_many_pings(nats_url):
    """Idle, the watch pings every IDLE_POLLS intervals; a process silent for one such ping still serves
    (the first request after a quiet while finds its model served), and is taken for lost after
    LOST_AFTER_POLLS of them."""
    interval = 0.2
    still, later, took = asyncio.run(_silent_worker(nats_url, PREFIX + "5", interval, asking=False))
    assert still and not later
    idle_gap = IDLE_POLLS * interval
    assert (LOST_AFTER_POLLS - 1) * idle_gap <= took < LOST_AFTER_POLLS * idle_gap + 2.0, took


def test_an_idle_watch_pings_every_few_intervals_and_a_request_brings_the_next_ping_forward(nats_url):
    async def run() -> tuple[int, float]:
        prefix = PREFIX + "6"
        interval = 0.3
        watcher = await nats.connect(nats_url)
        watch = FleetWatch(watcher, prefix, wait=0.05, interval=interval, busy=lambda: False)
        member = await _member(nats_url, "worker", "w1", prefix)
        pings: list[float] = []

        async def count(msg) -> None:
            pings.append(time.monotonic())

        spy = await member.subscribe("$SRV.PING.embedfleet-worker", cb=count)
        await member.flush()
        try:
            await watch.start()
            await asyncio.sleep(3.5 * IDLE_POLLS * interval)  # 5.25 s idle: 4 pings (0, 1.5, 3, 4.5 s), not 18
            idle = len(pings)
            asked = time.monotonic()
            watch.workers("m")  # a request goes out
            while len(pings) == idle and time.monotonic() - asked < 5:
                await asyncio.sleep(0.01)
            return idle, pings[-1] - asked
        finally:
            await spy.unsubscribe()
            await watch.stop()
            for nc in (watcher, member):
                await nc.close()

    idle, forward = asyncio.run(run())
    # 4 expected; a loaded machine delays a poll or two past the window's edges. Busy, the watch would
    # have pinged 18 times in the same while
    assert 2 <= idle <= 9, idle
    assert forward < 0.3 + 0.5, forward  # no later than an interval after the last ping, not at the next idle one


def test_requests_ask_for_held_replies_only_while_several_workers_serve_the_model(nats_url):
    """One worker: its death loses every missing row anyway, so no Held per chunk is asked; two: asked."""

    async def run() -> tuple[list[int], list[bool]]:
        prefix = PREFIX + "3"
        watcher = await nats.connect(nats_url)
        watch = FleetWatch(watcher, prefix, wait=0.2, interval=60)
        client = EmbedClient(watcher, Subjects(prefix), fleet=watch)
        asked: list[bool] = []

        async def tokenizer(msg) -> None:  # answers nothing: each request times out
            asked.append(decode_as(msg.data, EmbedRequest).held)

        members = [await _member(nats_url, "tokenizer", "t1", prefix), await _member(nats_url, "worker", "w1", prefix)]
        await members[0].subscribe(Subjects(prefix).embed("m"), cb=tokenizer)
        counts = []
        try:
            await watch.start()
            await client.start()
            for more in (None, "w2"):
                if more is not None:
                    members.append(await _member(nats_url, "worker", more, prefix))
                began = time.monotonic()
                await watch.refresh()
                # a loaded machine may miss a ping's wait: ask again, as the watch's own polls would
                while watch.workers("m") < len(members) - 1 and time.monotonic() - began < 10:
                    await watch.refresh()
                counts.append(watch.workers("m"))
                with pytest.raises(ServiceError):
                    await client.embed("m", ["a text"], EmbedOptions(), timeout=0.3)
            return counts, asked
        finally:
            await client.stop()
            await watch.stop()
            for nc in [watcher, *members]:
                await nc.close()

    counts, asked = asyncio.run(run())
    assert counts == [1, 2]
    assert asked == [False, True]


def test_a_request_after_an_idle_while_is_covered_by_the_liveness_checks_at_once(nats_url):
    """Idle, the watch's liveness checks sleep (no message, no wake-up); the first request that goes out
    wakes them: a worker whose connection closes while it holds the request is found within the
    liveness interval, and the request's rows go out again."""

    async def run() -> tuple[int, list[tuple], float]:
        prefix = PREFIX + "4"
        watcher, watch, client = await _watched_client(nats_url, prefix, wait=0.2, interval=60)
        lost: list[tuple] = []
        watch.on_lost(lambda *who: lost.append((time.monotonic(), who)))
        got = asyncio.Event()

        async def tokenizer(msg) -> None:  # takes the request, answers nothing
            got.set()

        members = [await _member(nats_url, "tokenizer", "t1", prefix), await _member(nats_url, "worker", "w1", prefix)]
        await members[0].subscribe(Subjects(prefix).embed("m"), cb=tokenizer)
        try:
            await watch.start()
            await client.start()
            began = time.monotonic()
            while not watch.serves("m") and time.monotonic() - began < 10:  # a loaded machine may miss a wait
                await watch.refresh()
            pings = 0

            async def count(msg) -> None:
                nonlocal pings
                pings += 1

            spy = await members[1].subscribe("$SRV.PING.>", cb=count)
            await asyncio.sleep(5 * LIVENESS_INTERVAL)  # a round already under way (a loaded machine) ends
            settled = pings
            await asyncio.sleep(10 * LIVENESS_INTERVAL)  # idle: no liveness check
            idle_pings = pings - settled
            await spy.unsubscribe()
            call = asyncio.create_task(client.embed("m", ["a text"], EmbedOptions(), timeout=5))
            await asyncio.wait_for(got.wait(), 5)
            closed = time.monotonic()
            await members[1].close()  # the worker dies holding the request
            while not lost and time.monotonic() - closed < 5:
                await asyncio.sleep(0.01)
            call.cancel()
            return idle_pings, lost, closed
        finally:
            await client.stop()
            await watch.stop()
            for nc in [watcher, *members]:
                if not nc.is_closed:
                    await nc.close()

    idle_pings, lost, closed = asyncio.run(run())
    # none expected; two straggling rounds of two members at most on a loaded machine (busy: 20 in the while)
    assert idle_pings <= 4, idle_pings
    assert [who for _, who in lost] == [("worker", "w1", "m")]
    # within a liveness interval or two (a loaded machine adds some): the background polls, a minute
    # apart here, could not have found it
    assert lost[0][0] - closed < 1.5


class _StoppableWorker:
    """A worker's ping endpoints answered by hand: ``answering`` False is what the watch sees of a SIGSTOP
    (silence, the connection open: the liveness checks get no 503)."""

    def __init__(self, nc: nats.NATS, prefix: str, instance: str) -> None:
        self.nc, self.prefix, self.instance = nc, prefix, instance
        self.service = "W" + instance.upper()  # a micro-service id: alphanumeric
        self.answering = True

    async def start(self) -> None:
        async def ping(msg) -> None:
            if self.answering:
                meta = {"prefix": self.prefix, "model": "m", "instance": self.instance}
                await msg.respond(json.dumps({"id": self.service, "metadata": meta}).encode())

        for subject in ("$SRV.PING.embedfleet-worker", f"$SRV.PING.embedfleet-worker.{self.service}"):
            await self.nc.subscribe(subject, cb=ping)
        await self.nc.flush()


def test_a_worker_taken_for_lost_by_its_silence_is_passed_over_until_it_answers_again(nats_url):
    """A stopped worker may still look live to a tokenizer (its last load report, sent idle, is stale there
    only after seconds): once the watch takes it for lost, the rows it held go out again naming it for the
    tokenizers to pass over, and so do new requests, until it answers a ping again."""

    async def run() -> tuple[list[tuple[str, ...]], tuple[str, ...], tuple[str, ...], float]:
        prefix = PREFIX + "7"
        watcher, watch, client = await _watched_client(nats_url, prefix, wait=0.1, interval=0.2)
        watch.on_lost(client.resend_missing)  # as the gateway and the scorer wire them
        avoided: list[tuple[str, ...]] = []
        tokenizer = await _member(nats_url, "tokenizer", "t1", prefix)
        w1 = await _member(nats_url, "worker", "w1", prefix)
        w2 = _StoppableWorker(await nats.connect(nats_url), prefix, "w2")
        await w2.start()

        async def tokenize(msg) -> None:  # the first attempt's rows taken by w2; nothing answered
            request = decode_as(msg.data, EmbedRequest)
            avoided.append(request.avoid)
            if len(avoided) == 1:
                await tokenizer.publish(msg.reply, encode(Held(request.id, 0, request.count, "w2")))

        await tokenizer.subscribe(Subjects(prefix).embed("m"), cb=tokenize)

        async def workers(n: int) -> None:
            began = time.monotonic()
            while watch.workers("m") != n and time.monotonic() - began < 10:
                await asyncio.sleep(0.02)
            assert watch.workers("m") == n

        try:
            await watch.start()
            await client.start()
            await workers(2)
            call = asyncio.create_task(client.embed("m", ["a", "b"], EmbedOptions(), timeout=8))
            while not avoided:
                await asyncio.sleep(0.01)
            w2.answering = False
            stopped = time.monotonic()
            while len(avoided) < 2 and time.monotonic() - stopped < 8:
                await asyncio.sleep(0.01)
            resent = time.monotonic() - stopped
            silenced = watch.silenced("m"), watch.silenced("another model")
            call.cancel()
            w2.answering = True
            await workers(2)
            with pytest.raises(ServiceError):
                await client.embed("m", ["c"], EmbedOptions(), timeout=0.3)
            return avoided, *silenced, resent
        finally:
            await client.stop()
            await watch.stop()
            for nc in (watcher, tokenizer, w1, w2.nc):
                await nc.close()

    avoided, silenced, other, resent = asyncio.run(run())
    assert avoided == [(), ("w2",), ()]  # first attempt, its rows sent again, a request after w2 answers again
    assert silenced == ("w2",) and other == ()
    assert resent < LOST_AFTER_POLLS * 0.2 + 3.0, resent  # three polls and a wait, room for a loaded machine
