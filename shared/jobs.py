"""JetStream resources of bulk jobs: streams, durable consumers and the job-state bucket.

- ``<P>_JOBS``: work queue of job batches clients publish (``<prefix>.v1.jobs.<model>``);
- ``<P>_BULK``: work queue of token batches, tokenizers -> workers (``<prefix>.v1.bulk.<model>``);
- ``<P>_RESULTS``: vectors per job (``<prefix>.v1.results.<job>``), deduplicated by message id;
- ``<P>_jobs`` key-value bucket: one JSON state per job.
All in file storage, created idempotently by whichever service starts first.
"""

from __future__ import annotations

import logging

from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError
from nats.js.kv import KeyValue

from shared.subjects import Subjects

log = logging.getLogger("embedfleet.jobs")

DUPLICATE_WINDOW = 600.0  # seconds a message id is remembered: redeliveries inside it are dropped
RESULTS_MAX_AGE = 7 * 24 * 3600.0
ACK_WAIT = 60.0  # seconds before an unacknowledged batch is redelivered (work sends in-progress beats)
MAX_DELIVER = 5  # then the batch is given up and recorded as dead in the job's state


def _base(subjects: Subjects) -> str:
    return subjects.prefix.replace(".", "_").replace("-", "_").upper()


def stream_names(subjects: Subjects) -> dict[str, str]:
    base = _base(subjects)
    return {"jobs": f"{base}_JOBS", "bulk": f"{base}_BULK", "results": f"{base}_RESULTS", "kv": f"{base}_jobs"}


async def ensure_streams(js: JetStreamContext, subjects: Subjects) -> KeyValue:
    """Create (or update to this config) the three streams and the bucket; returns the bucket."""
    names = stream_names(subjects)
    p = subjects.prefix
    configs = [
        StreamConfig(name=names["jobs"], subjects=[f"{p}.v1.jobs.>"], retention=RetentionPolicy.WORK_QUEUE,
                     storage=StorageType.FILE, duplicate_window=DUPLICATE_WINDOW),
        StreamConfig(name=names["bulk"], subjects=[f"{p}.v1.bulk.>"], retention=RetentionPolicy.WORK_QUEUE,
                     storage=StorageType.FILE, duplicate_window=DUPLICATE_WINDOW),
        StreamConfig(name=names["results"], subjects=[f"{p}.v1.results.>"], retention=RetentionPolicy.LIMITS,
                     storage=StorageType.FILE, duplicate_window=DUPLICATE_WINDOW, max_age=RESULTS_MAX_AGE),
    ]
    for config in configs:
        try:
            await js.add_stream(config)
        except BadRequestError:
            await js.update_stream(config)  # exists with other settings: bring it to ours
    try:
        return await js.key_value(names["kv"])
    except Exception:
        return await js.create_key_value(bucket=names["kv"], history=1, storage=StorageType.FILE)


def work_consumer(durable: str, subject: str) -> ConsumerConfig:
    return ConsumerConfig(durable_name=durable, filter_subject=subject, ack_wait=ACK_WAIT, max_deliver=MAX_DELIVER)


async def update_state(kv: KeyValue, job: str, change) -> dict:
    """Read-modify-write a job's JSON state with compare-and-set, retrying on a concurrent writer."""
    import json

    from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

    while True:
        try:
            entry = await kv.get(job)
            state, revision = json.loads(entry.value), entry.revision
        except KeyNotFoundError:
            state, revision = {"job": job}, None
        change(state)
        value = json.dumps(state).encode()
        try:
            if revision is None:
                await kv.create(job, value)
            else:
                await kv.update(job, value, last=revision)
            return state
        except (KeyWrongLastSequenceError, BadRequestError):
            continue  # someone else wrote first: read again


def record_error(state: dict, message: str) -> None:
    state.setdefault("errors", []).append(message[:500])


async def submit(
    js: JetStreamContext, kv: KeyValue, subjects: Subjects, job: str, model: str,
    docs: list[tuple[str, str]], batch_size: int, options, source: str,
) -> dict:
    """Record a job and publish its batches not yet published (so a resubmission resumes)."""
    import time

    from shared.protocol import JobBatch, encode

    batches = [docs[i : i + batch_size] for i in range(0, len(docs), batch_size)]

    def start(state: dict) -> None:
        state.update(model=model, input=source, documents=len(docs), batches=len(batches))
        state.setdefault("status", "running")
        state.setdefault("started", time.time())
        state.setdefault("published", 0)

    state = await update_state(kv, job, start)
    for i in range(state["published"], len(batches)):
        batch = JobBatch(job, i, model, [d for d, _ in batches[i]], [t for _, t in batches[i]], options)
        # the stream's acknowledgement of each publish is the backpressure
        await js.publish(subjects.jobs(model), encode(batch), headers={"Nats-Msg-Id": f"{job}:{i}"})
        if i % 8 == 7 or i == len(batches) - 1:
            await update_state(kv, job, lambda s, n=i + 1: s.update(published=max(s.get("published", 0), n)))
    return state


async def fetch_one(psub) -> list:
    """Up to one message from a pull subscription, waiting half a second; [] when none (or reconnecting)."""
    import asyncio

    from nats.errors import TimeoutError as NatsTimeoutError

    try:
        return await psub.fetch(1, timeout=0.5)
    except (asyncio.TimeoutError, NatsTimeoutError):
        return []
    except Exception as exc:  # reconnecting: try again shortly
        log.debug("fetch: %s", exc)
        await asyncio.sleep(0.5)
        return []


async def close_pull(psub) -> None:
    """Unsubscribe a pull subscription (left open, it stalls the connection's drain)."""
    try:
        await psub.unsubscribe()
    except Exception as exc:
        log.debug("unsubscribe: %s", exc)
