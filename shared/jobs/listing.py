"""Every job record in the job bucket, read once, a fetch at a time: what ``GET /v1/jobs`` pages through.

The bucket is a stream (``KV_<bucket>``) holding a job's record as the last message on its key's
subject; an ephemeral consumer of its own (deliver last per subject, acknowledging nothing) gives each
key's current record in stream order, ``FETCH`` records a fetch, so a reader holds one fetch's records
at a time however many jobs the bucket keeps (``--job-ttl`` bounds them). A deleted or purged key (its
last message a marker) is no record. ``listed`` reads what a listing orders and filters by from a
record's JSON without checking all of it (``JobState.decode`` does, for the records a page keeps).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import orjson
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from embedfleet.shared.jobs.streams import bucket_stream, stream_names
from embedfleet.shared.jobs.work_queue import close_pull
from embedfleet.shared.nats.subjects import Subjects

log = logging.getLogger("embedfleet.job_listing")

FETCH = 256  # records a fetch asks for: a record is ~0.3-20 KB (its dead batches listed), so at most a few MB held
FETCH_WAIT = 5.0  # seconds a fetch waits for records the consumer said it holds
INACTIVE = 30.0  # seconds the server keeps a consumer its reader left (a request cut short)
# headers of a message that is no record: a delete or purge (KV-Operation), a server's expiry marker
_MARKERS = ("KV-Operation", "Nats-Marker-Reason")


class RecordsLost(Exception):
    """The job bucket stopped giving the records it said it held."""


class TooManyRecords(Exception):
    """The job bucket holds more keys than a reader reads."""

    def __init__(self, held: int, most: int) -> None:
        super().__init__(f"the job bucket holds {held} records, more than the {most} a listing reads")
        self.held, self.most = held, most


@dataclass(frozen=True, slots=True)
class Listed:
    """What a listing orders and filters a job by: its id, when it was first submitted (unix time;
    0.0 when not recorded), its owner's key digest and its status."""

    job: str
    started: float
    owner: str | None
    status: str | None


def listed(data: bytes, job: str) -> Listed | None:
    """A record's ``Listed``; None for one that names no submitted job (nothing submitted under the
    id yet, or not a JSON object)."""
    try:
        record = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict) or record.get("documents") is None:
        return None
    started, owner, status = record.get("started"), record.get("owner"), record.get("status")
    return Listed(
        job,
        float(started) if isinstance(started, (int, float)) and not isinstance(started, bool) else 0.0,
        owner if isinstance(owner, str) else None,
        status if isinstance(status, str) else None,
    )


async def bucket_records(
    js: JetStreamContext, subjects: Subjects, most: int | None = None
) -> AsyncGenerator[tuple[str, bytes], None]:
    """(job id, record) for every key of the job bucket, in the order of their last writes; records
    written after the reading started may be given too. TooManyRecords, before any is read, when the
    bucket holds more than ``most`` keys (None: no bound). RecordsLost when the server stops giving
    records it said it held (gone, or a reader not allowed to fetch them): never a listing cut short."""
    from nats.errors import TimeoutError as NatsTimeoutError

    stream, prefix = bucket_stream(subjects), f"$KV.{stream_names(subjects)['kv']}."
    psub = await js.pull_subscribe(
        f"{prefix}>",
        stream=stream,
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=INACTIVE,
            mem_storage=True,  # a reader's position, not worth a disk write or a replica
            num_replicas=1,
        ),
    )
    try:
        pending = (await psub.consumer_info()).num_pending or 0
        if most is not None and pending > most:
            raise TooManyRecords(pending, most)
        while pending:
            try:
                msgs = await psub.fetch(min(FETCH, pending), timeout=FETCH_WAIT)
            except (TimeoutError, NatsTimeoutError):
                raise RecordsLost(f"the job bucket stopped giving records with {pending} unread") from None
            for msg in msgs:
                pending = msg.metadata.num_pending
                if not (msg.headers and any(h in msg.headers for h in _MARKERS)):
                    yield msg.subject.removeprefix(prefix), msg.data
    finally:
        try:
            await js.delete_consumer(stream, psub._consumer)  # nats-py keeps the consumer's name there
        except Exception as exc:  # gone already, or the server is away: it expires by itself
            log.debug("job bucket: listing consumer not deleted: %r", exc)
        await close_pull(psub)
