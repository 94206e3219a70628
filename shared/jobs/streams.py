"""JetStream resources of bulk jobs: streams, durable consumers and the job-state bucket.

- ``<P>_JOBS``: work queue of job batches clients publish (``<prefix>.v1.jobs.<model>``);
- ``<P>_BULK``: work queue of token batches, tokenizers -> workers (``<prefix>.v1.bulk.<model>``);
- ``<P>_RESULTS``: vectors per job (``<prefix>.v1.results.<job>``), deduplicated by message id;
- ``<P>_DEAD``: dead letters (``<prefix>.v1.dead.<job>``): batches given up, kept with the stage, the
  reason and the number of deliveries in headers, so they can be inspected and published again;
- ``<P>_jobs`` key-value bucket: one JSON state per job;
- ``<P>_CLAIMS``: each job's owner and batch-signing secret, written once (shared/jobs/claims.py).
All in file storage, created by ``embedfleet init`` (or, on a server without per-role users, by
whichever service starts first: ``open_streams``). The results stream and
the bucket expire what they hold after the limits of ``Retention`` (shared/jobs/settings.py).
"""

from __future__ import annotations

import asyncio
import logging
import time

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from embedfleet.shared.config.sections.bulk import JOB_TTL, RESULTS_MAX_AGE
from embedfleet.shared.jobs.claims import claims_config, claims_stream
from embedfleet.shared.jobs.settings import JobSettings, Retention
from embedfleet.shared.nats.placement import Placement, stream_config
from embedfleet.shared.nats.subjects import Subjects

log = logging.getLogger("embedfleet.jobs")

DUPLICATE_WINDOW = 600.0  # seconds a message id is remembered: redeliveries inside it are dropped
DEAD_MAX_AGE = 30 * 24 * 3600.0
INIT_WAIT = 60.0  # seconds a service waits for `embedfleet init` to make the streams it may not make


def _base(subjects: Subjects) -> str:
    return subjects.prefix.replace(".", "_").replace("-", "_").upper()


def stream_names(subjects: Subjects) -> dict[str, str]:
    base = _base(subjects)
    return {
        "jobs": f"{base}_JOBS",
        "bulk": f"{base}_BULK",
        "results": f"{base}_RESULTS",
        "dead": f"{base}_DEAD",
        "kv": f"{base}_jobs",
    }


def bucket_stream(subjects: Subjects) -> str:
    """The stream that holds the job bucket (JetStream keeps a bucket as the stream ``KV_<bucket>``)."""
    return f"KV_{stream_names(subjects)['kv']}"


async def ensure_streams(js: JetStreamContext, subjects: Subjects, retention: Retention = Retention()) -> KeyValue:
    """Create the four streams and the bucket, or bring existing ones to this config; the limits
    ``retention`` leaves unset stay as an existing stream or bucket has them. Returns the bucket.

    Replicas: ``retention.replicas`` copies, exactly; unset, ``AUTO_REPLICAS`` on a clustered server
    (1 where the cluster cannot place that many, said in the log) and an existing stream raised to
    that, never lowered (an operator may have set more)."""
    names = stream_names(subjects)
    p = subjects.prefix
    results = await stream_config(js, names["results"])
    results_age = _chosen(retention.results_max_age, results and results.max_age, RESULTS_MAX_AGE)
    # no size limit unless given: a stream's max_bytes is reserved from the server's JetStream storage when
    # the stream is made, and a default the store cannot hold (a 4 GB dev store) would refuse every stream
    results_bytes = _chosen(retention.results_max_bytes, results and results.max_bytes, 0)
    configs = [
        StreamConfig(
            name=names["jobs"],
            subjects=[f"{p}.v1.jobs.>"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            duplicate_window=DUPLICATE_WINDOW,
        ),
        StreamConfig(
            name=names["bulk"],
            subjects=[f"{p}.v1.bulk.>"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            duplicate_window=DUPLICATE_WINDOW,
        ),
        StreamConfig(
            name=names["results"],
            subjects=[f"{p}.v1.results.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            duplicate_window=_window(DUPLICATE_WINDOW, results_age),
            max_age=results_age,
            max_bytes=results_bytes if results_bytes > 0 else -1,
        ),
        StreamConfig(
            name=names["dead"],
            subjects=[f"{p}.v1.dead.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            duplicate_window=DUPLICATE_WINDOW,
            max_age=DEAD_MAX_AGE,
        ),
    ]
    placement = Placement(js, retention.replicas)
    for config in configs:
        assert config.name is not None  # every stream above is named
        current = results if config.name == names["results"] else await stream_config(js, config.name)
        await placement.put(config, current)
    kv = await _ensure_bucket(js, names["kv"], retention, placement)
    # jobs' claims (shared/jobs/claims.py) are kept as long as their records
    ttl = (await js.stream_info(bucket_stream(subjects))).config.max_age or 0
    name = claims_stream(subjects)
    await placement.put(claims_config(subjects, ttl), await stream_config(js, name))
    return kv


async def open_streams(
    js: JetStreamContext, subjects: Subjects, retention: Retention = Retention(), wait: float = INIT_WAIT
) -> KeyValue:
    """The streams and the bucket as ``embedfleet init`` made them, used as they are: a service's NATS
    user may read them, not change them (shared/permissions.py). Only when one is missing are they
    made (``ensure_streams``); a server with per-role users refuses a service that, and then they are
    waited for up to ``wait`` seconds (``embedfleet init`` may be running beside the service, as a
    Kubernetes Job does) before giving up, naming the command."""
    from nats.errors import Error as NatsError

    names = stream_names(subjects)
    wanted = [names[k] for k in ("jobs", "bulk", "results", "dead")] + [
        bucket_stream(subjects),
        claims_stream(subjects),
    ]
    missing = [name for name in wanted if await stream_config(js, name) is None]
    if not missing:
        return await js.key_value(names["kv"])
    log.info("streams %s missing: making them", ", ".join(missing))
    try:
        return await ensure_streams(js, subjects, retention)
    except (TimeoutError, NatsError) as exc:  # a permission violation reaches the caller as a timeout
        refused = exc
    log.warning("streams %s missing, and this service may not make them: waiting for `embedfleet init`", missing)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        missing = [name for name in missing if await stream_config(js, name) is None]
        if not missing:
            return await js.key_value(names["kv"])
    raise RuntimeError(
        f"the JetStream streams {', '.join(missing)} are missing and this service may not make them "
        f"({refused!r}): run `embedfleet init` with the operator's credentials"
    )


async def _ensure_bucket(js: JetStreamContext, bucket: str, retention: Retention, placement: Placement) -> KeyValue:
    """The job bucket, created with ``retention``'s limits or brought to those it sets, with the
    replicas ``placement`` settled."""
    stream = f"KV_{bucket}"
    current = await stream_config(js, stream)
    ttl = _chosen(retention.job_ttl, current and current.max_age, JOB_TTL)
    history = _chosen(retention.job_history, current and current.max_msgs_per_subject, 1)
    if current is None:
        try:
            return await placement.create(
                stream,
                lambda n: js.create_key_value(
                    bucket=bucket, history=history, ttl=ttl or None, storage=StorageType.FILE, replicas=n
                ),
            )
        except BadRequestError:  # created meanwhile by another process, with other limits
            current = await stream_config(js, stream)
            assert current is not None  # the server said it exists
    replicas = placement.target(current.num_replicas)
    if (
        abs((current.max_age or 0) - ttl) > 1e-3
        or current.max_msgs_per_subject != history
        or replicas != current.num_replicas
    ):
        log.info(
            "bucket %s: record ttl %.0fs, %d revisions a job (was %.0fs, %d)",
            bucket,
            ttl,
            history,
            current.max_age or 0,
            current.max_msgs_per_subject,
        )
        await placement.update(
            stream,
            current.num_replicas or 1,
            lambda n: js.update_stream(
                current.evolve(
                    max_age=ttl,
                    max_msgs_per_subject=history,
                    duplicate_window=_window(current.duplicate_window, ttl),
                    num_replicas=n,
                )
            ),
        )
    return await js.key_value(bucket)


async def job_bucket(js: JetStreamContext, subjects: Subjects) -> KeyValue | None:
    """The job bucket as it is, or None when there is none yet (nothing created, nothing changed)."""
    try:
        return await js.key_value(stream_names(subjects)["kv"])
    except BucketNotFoundError:
        return None


async def purge_wait(js: JetStreamContext, subjects: Subjects, job: str) -> float:
    """Seconds before a purged job can be published afresh (0: now). Its batches and results carry
    the message ids of its earlier run, which the streams remember for ``DUPLICATE_WINDOW`` seconds
    and drop as repeats: counted from the purge (the bucket's marker), which came after its last
    publish. The marker's time is the server's clock."""
    try:
        marker = await js.get_last_msg(bucket_stream(subjects), f"$KV.{stream_names(subjects)['kv']}.{job}")
    except NotFoundError:
        return 0.0
    if (marker.headers or {}).get("KV-Operation") != "PURGE" or marker.time is None:
        return 0.0
    return max(0.0, marker.time.timestamp() + DUPLICATE_WINDOW - time.time())


def _chosen(given, existing, default):
    """A retention limit: the one given, else the one in place, else the default (a new stream)."""
    return given if given is not None else existing if existing is not None else default


def _window(window: float | None, max_age: float) -> float:
    """A duplicate window the server accepts: no longer than the stream's age limit (0: none)."""
    window = window or DUPLICATE_WINDOW
    return min(window, max_age) if max_age else window


def work_consumer(durable: str, subject: str, settings: JobSettings) -> ConsumerConfig:
    """A stage's durable consumer, with as many copies of its state as its stream has (replicas 0:
    the stream's, now and after it is raised)."""
    return ConsumerConfig(
        name=durable,
        durable_name=durable,
        filter_subject=subject,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=settings.ack_wait,
        max_deliver=settings.max_deliver,
        num_replicas=0,
    )
