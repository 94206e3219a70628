"""Holding bulk work taken from a JetStream work queue: consumers, in-progress beats, dead letters.

A stage (tokenizer or worker) takes a batch from a durable pull consumer, keeps telling the server
it is still working on it (``in_progress`` every ``ack_wait / 4``) until its output is durably
accepted downstream, then acknowledges it. A batch that can never succeed is given up at once; one
that keeps failing is given up on its last delivery; one whose holders keep dying (a batch that
crashes the process) is given up by the server after ``max_deliver`` deliveries, which it announces
in an advisory. Each way, the batch becomes a dead letter: copied to the dead-letter stream with the
stage, the reason and the delivery count in headers, its documents counted as failed in the job's
state. Never retried forever, never lost without a record.

A batch of a cancelled job is acknowledged and dropped unprocessed (``Cancellations``). A stage told
to stop hands back (nak, no delay) what it holds and has not started, so the fleet takes it at once
instead of after ``ack_wait``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from embedfleet.shared.jobs.bucket import has_state_key, read_state, update_state
from embedfleet.shared.jobs.progress import Rows
from embedfleet.shared.jobs.publish import publish_durably
from embedfleet.shared.jobs.settings import JobSettings
from embedfleet.shared.jobs.state import CANCELLED, DeadBatch, JobState
from embedfleet.shared.jobs.status import count_failed
from embedfleet.shared.jobs.streams import open_streams, stream_names, work_consumer
from embedfleet.shared.nats.lifecycle import cancel
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import MAX_NAME, ChunkRows

log = logging.getLogger("embedfleet.bulk")

STAGE = "Embedfleet-Stage"
REASON = "Embedfleet-Reason"
DELIVERIES = "Embedfleet-Deliveries"
ORIGIN = "Embedfleet-Origin"  # the original subject
TRUNCATED = "Embedfleet-Truncated"  # the original size, when the payload was cut to fit with these headers
_HEADER_ROOM = 1024  # bytes for the headers beside the reason, the origin and the message id


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """What a dead letter records about a batch: its job, batch index, first row and documents, and
    the number of documents in its job batch (0: not known). A chunked job's token batch holds chunk
    rows (``chunks`` says whose, ``total`` is the job batch's chunks)."""

    job: str | None
    batch: int | None = None
    start: int = 0
    documents: int = 0
    total: int = 0
    chunks: ChunkRows | None = None
    counted: bool = True  # False: a batch refused as not its job's, its letter kept under the job it names only

    @property
    def rows(self) -> Rows:
        return Rows(self.batch if self.batch is not None else -1, self.start, self.documents, self.total)


async def open_work(js: JetStreamContext, stream: str, durable: str, subject: str, settings: JobSettings):
    """The stage's durable pull consumer, created or brought to ``settings``, and a subscription on it.
    The consumer keeps as many copies as its stream, and follows it when the stream is raised to more
    (the server moves it once the stream's new peers have settled, some seconds)."""
    from nats.js.errors import BadRequestError

    try:
        await js.add_consumer(stream, work_consumer(durable, subject, settings))  # creates it, or updates it
    except BadRequestError as exc:
        log.warning("consumer %s kept its settings: %s", durable, exc.description)
    return await js.pull_subscribe_bind(durable=durable, stream=stream)


# seconds a fetch waits at the server for a batch: one published meanwhile is delivered at once, so the
# wait costs a batch no time; it only sets how often an idle stage asks again (and with it, the server)
FETCH_WAIT = 5.0
# quiet fetches between two checks that an idle stage's consumer still exists: a lost consumer is
# noticed within ~10 s, at the cost of one consumer-info request per idle stage
CHECK_EVERY = 2


class WorkQueue:
    """A stage's durable consumer and its pull subscription, made again and bound again when the
    server has lost the consumer (deleted, or kept on a node that is gone).

    Whether it is there is asked after a failed fetch (which has already waited half a second), and
    after every ``check_every`` fetches in a row that found nothing. A fetch that finds a message
    never asks, so a busy stage costs the server nothing; an idle one asks every ~10 s and a failing
    one at most twice a second, each ask bounded by the JetStream request timeout (5 s). A fetch
    waits ``wait`` seconds for a batch; ``stop_fetching`` ends the one under way (the stage stops)."""

    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        durable: str,
        subject: str,
        settings: JobSettings,
        check_every: int = CHECK_EVERY,
        wait: float = FETCH_WAIT,
    ) -> None:
        self._js, self._stream, self._durable, self._subject, self._settings = js, stream, durable, subject, settings
        self._check_every = check_every
        self._wait = wait
        self._quiet = 0
        self._fetching: asyncio.Task | None = None
        self._stopped = False  # stop_fetching was called: fetches find nothing
        self.psub = None

    async def open(self) -> None:
        self.psub = await open_work(self._js, self._stream, self._durable, self._subject, self._settings)

    async def fetch(self) -> list:
        """Up to one message, waiting up to ``wait`` seconds; [] when none (or reconnecting, or stopped)."""
        if self._stopped:
            return []
        self._fetching = asyncio.ensure_future(_fetch(self.psub, self._wait))
        try:
            msgs, failed = await self._fetching
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller itself is cancelled
            return []  # stopped: a batch its pull request brings later is handed back (hand_back_pending)
        finally:
            self._fetching = None
        if msgs:
            self._quiet = 0
            return msgs
        self._quiet += 1
        if failed or self._quiet >= self._check_every:
            self._quiet = 0
            await self._rebind_if_lost()
        return msgs

    async def _rebind_if_lost(self) -> None:
        from nats.js.errors import NotFoundError

        try:
            await self._js.consumer_info(self._stream, self._durable)
            return
        except NotFoundError:
            pass
        except Exception as exc:  # the server is away, or between leaders: the next check asks again
            log.debug("consumer %s: %r", self._durable, exc)
            return
        log.warning("consumer %s on %s was lost: making it again", self._durable, self._stream)
        old = self.psub
        try:
            await self.open()
        except Exception as exc:
            log.warning("consumer %s not made again yet: %r", self._durable, exc)
            return
        await close_pull(old)

    def stop_fetching(self) -> None:
        """The stage stops: the fetch under way ends now, finding nothing (it need not be waited out), and
        no other starts."""
        self._stopped = True
        if self._fetching is not None:
            self._fetching.cancel()

    async def hand_back_pending(self) -> int:
        return await hand_back_pending(self.psub)

    async def close(self) -> None:
        await close_pull(self.psub)


async def join_work(
    nc: Client,
    subjects: Subjects,
    stream: str,
    durable: str,
    subject: str,
    settings: JobSettings,
    stage: str,
    describe: Callable[[bytes, dict], BatchInfo],
):
    """A stage's place in the bulk pipeline: the streams and job bucket (made by `embedfleet init`), its
    durable consumer on ``stream`` ("jobs" or "bulk"), and its dead letters, with the server's
    max-deliveries advisories watched. Returns (jetstream, bucket, work queue, dead letters)."""
    js = nc.jetstream()
    kv = await open_streams(js, subjects, settings.retention)
    name = stream_names(subjects)[stream]
    work = WorkQueue(js, name, durable, subject, settings)
    await work.open()
    dead = DeadLetters(nc, js, kv, subjects, stage)
    await dead.watch(name, durable, describe)
    return js, kv, work, dead


async def _fetch(psub, wait: float) -> tuple[list, bool]:
    """(up to one message, whether the fetch failed otherwise than by finding none)."""
    from nats.errors import TimeoutError as NatsTimeoutError

    try:
        return await psub.fetch(1, timeout=wait), False
    except (TimeoutError, NatsTimeoutError):
        return [], False
    except Exception as exc:  # reconnecting, or the consumer is gone: try again shortly
        log.debug("fetch: %r", exc)
        await asyncio.sleep(0.5)
        return [], True


async def close_pull(psub) -> None:
    """Unsubscribe a pull subscription (left open, it stalls the connection's drain)."""
    try:
        await psub.unsubscribe()
    except Exception as exc:
        log.debug("unsubscribe: %s", exc)


async def hand_back(msg) -> None:
    """Give a held message back to the server for the next taker, at once (no redelivery delay)."""
    try:
        await msg.nak()
    except Exception as exc:  # disconnected: it comes back after ack_wait instead
        log.debug("hand back: %r", exc)


async def hand_back_pending(psub) -> int:
    """Hand back what the server delivered to ``psub`` after the last fetch stopped waiting (a pull
    request answered as it expired); returns how many. Call it once no fetch runs."""
    handed = 0
    while psub.pending_msgs:
        try:  # served from the buffered messages (a new pull request only when they are all status notes)
            msgs = await psub.fetch(1, timeout=0.05)
        except Exception:
            break
        for msg in msgs:
            await hand_back(msg)
            handed += 1
    return handed


class Cancellations:
    """Which jobs are cancelled, as a stage learns it: from the job's state, read again once the last
    read is ``ttl`` seconds old (so a cancellation is seen within that). A job found cancelled is not
    read again for ``hold`` seconds, so its queued batches are dropped without a read each; then it
    is, since a purged job's id may come to name a new job. The last ``size`` jobs are remembered."""

    def __init__(self, kv: KeyValue, ttl: float = 1.0, hold: float = 60.0, size: int = 4096) -> None:
        self._kv = kv
        self._ttl = ttl
        self._hold = hold
        self._size = size
        self._seen: OrderedDict[str, tuple[float, bool]] = OrderedDict()  # job -> (monotonic time read, cancelled)

    async def cancelled(self, job: str) -> bool:
        now = time.monotonic()
        read, cancelled = self._seen.get(job, (None, False))
        if read is not None and now - read < (self._hold if cancelled else self._ttl):
            return cancelled
        if not has_state_key(job):
            return False
        try:
            state = await asyncio.wait_for(read_state(self._kv, job), self._ttl * 2)
        except Exception as exc:  # the server is away: the last answer stands (none: the work is done, not lost)
            log.debug("job %s: state not read: %r", job, exc)
            return cancelled
        cancelled = state is not None and state.status == CANCELLED
        self._seen[job] = (now, cancelled)
        self._seen.move_to_end(job)
        while len(self._seen) > self._size:
            self._seen.popitem(last=False)
        return cancelled


def deliveries(msg) -> int:
    try:
        return msg.metadata.num_delivered
    except Exception:
        return 1


class Heartbeats:
    """Tells the server, every ``interval`` seconds, that each held message is still being worked on."""

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._held: dict[int, Msg] = {}  # by identity: messages are not hashable
        self._task: asyncio.Task | None = None

    def hold(self, msg) -> None:
        self._held[id(msg)] = msg
        if self._task is None:
            self._task = asyncio.create_task(self._beat(), name="in-progress-beats")

    def release(self, msg) -> bool:
        """Stop beating for ``msg``; False when it was not held (released before)."""
        return self._held.pop(id(msg), None) is not None

    async def stop(self) -> None:
        await cancel(self._task)
        self._task = None

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            for msg in list(self._held.values()):
                try:
                    await msg.in_progress()
                except Exception as exc:  # disconnected: the next beat tries again
                    log.debug("in-progress beat: %r", exc)


class DeadLetters:
    """Gives batches up: records them in the dead-letter stream and in their job's state, and
    listens for the server's max-deliveries advisories on the stage's consumer."""

    def __init__(self, nc: Client, js: JetStreamContext, kv: KeyValue, subjects: Subjects, stage: str) -> None:
        self._nc = nc
        self._js = js
        self._kv = kv
        self._subjects = subjects
        self._stage = stage
        self._sub: Subscription | None = None

    async def give_up(self, msg, reason: str, info: BatchInfo) -> None:
        """A batch that must not be tried again: recorded, then terminated (no more deliveries)."""
        await self.record(msg.data, msg.headers or {}, msg.subject, reason, info, deliveries(msg))
        try:
            await msg.term()
        except Exception as exc:
            log.warning("terminating a dead batch: %r", exc)

    async def record(self, data: bytes, headers: dict, subject: str, reason: str, info: BatchInfo, count: int) -> None:
        job = info.job or "unknown"
        log.warning("job %s: %s gives batch %s up after %d deliveries: %s", job, self._stage, info.batch, count, reason)
        origin_id = headers.get("Nats-Msg-Id") or f"{subject}:{time.time_ns()}"
        if len(origin_id) > MAX_NAME:  # an untrusted header: its digest names the record as well
            origin_id = hashlib.sha256(origin_id.encode()).hexdigest()
        record = {STAGE: self._stage, REASON: reason[:500], DELIVERIES: str(count), ORIGIN: subject}
        # headers count toward the server's payload limit, and a message over it closes the connection:
        # a batch that (nearly) filled a message alone is kept cut, with its size said
        room = self._nc.max_payload - _HEADER_ROOM - len(f"{reason[:500]}{subject}{origin_id}".encode())
        if len(data) > room:
            data, record[TRUNCATED] = data[: max(room, 0)], str(len(data))
        await publish_durably(
            self._js, self._subjects.dead(job), data, f"dead:{self._stage}:{origin_id}", headers=record
        )
        if info.job is None or not info.counted or not has_state_key(info.job):
            # a forged job id, or a batch refused as not its job's: the letter is all there is
            return
        # recorded again after a crash between record and term: the rows and the entry count once
        entry = DeadBatch(self._stage, info.batch, info.start, info.documents, count, reason[:500])

        def tally(state: JobState) -> JobState:
            rows = info.rows
            if info.chunks is None and self._stage == "worker" and state.chunking is not None:
                # a chunked job's token batch that does not decode: chunk rows of documents it cannot
                # name, listed as dead but counted nowhere (never counted as the documents of its rows)
                rows = rows._replace(batch=-1)
            return count_failed(state, rows, entry, info.chunks)

        await update_state(self._kv, info.job, tally)

    async def watch(self, stream: str, durable: str, describe: Callable[[bytes, dict], BatchInfo]) -> None:
        """Turn the server's max-deliveries advisories for ``durable`` into dead letters (one watcher
        of the fleet answers each: queue group)."""
        subject = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{durable}"

        async def on_advisory(advisory) -> None:
            try:
                event = json.loads(advisory.data)
                seq, count = int(event["stream_seq"]), int(event.get("deliveries", 0))
                raw = await self._js.get_msg(stream, seq)
            except Exception as exc:
                log.warning("max-deliveries advisory not handled: %r", exc)
                return
            headers = dict(raw.headers or {})
            await self.record(
                raw.data or b"",
                headers,
                raw.subject or "",
                "delivered too many times without an acknowledgement (its holders died or timed out)",
                describe(raw.data or b"", headers),
                count,
            )
            try:
                await self._js.delete_msg(stream, seq)  # out of the work queue: it is in the dead-letter stream
            except Exception as exc:
                log.warning("removing dead batch %d from %s: %r", seq, stream, exc)

        self._sub = await self._nc.subscribe(subject, queue=f"dead-{durable}", cb=on_advisory)

    async def stop(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:
                pass
            self._sub = None


def job_from_msg_id(headers: dict, numbers: int) -> BatchInfo:
    """``JOB:BATCH`` (job batches) or ``JOB:BATCH:ROW`` (token batches) message ids name the job even
    when the payload cannot be decoded; ``numbers`` is how many numeric parts end the id."""
    parts = (headers.get("Nats-Msg-Id") or "").rsplit(":", numbers)
    # the id is untrusted: a job name must make a valid subject, the numbers plain ASCII digits
    if (
        len(parts) != numbers + 1
        or not 0 < len(parts[0]) <= MAX_NAME
        or not all(p.isascii() and p.isdigit() and len(p) <= 20 for p in parts[1:])
    ):
        return BatchInfo(None)
    return BatchInfo(parts[0], int(parts[1]), int(parts[2]) if numbers > 1 else 0)


def undecodable(data: bytes, headers: dict, numbers: int) -> BatchInfo:
    """What can be said of a batch that does not decode: its job and index from the message id, its
    document count from the ``di`` list if the payload is at least a msgpack map."""
    import msgpack

    info = job_from_msg_id(headers, numbers)
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=False)
        docs = body.get("di") if isinstance(body, dict) else None
        count = len(docs) if isinstance(docs, list) else 0
    except Exception:
        count = 0
    return BatchInfo(info.job, info.batch, info.start, count)
