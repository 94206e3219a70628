"""JetStream resources of bulk jobs: streams, durable consumers and the job-state bucket.

- ``<P>_JOBS``: work queue of job batches clients publish (``<prefix>.v1.jobs.<model>``);
- ``<P>_BULK``: work queue of token batches, tokenizers -> workers (``<prefix>.v1.bulk.<model>``);
- ``<P>_RESULTS``: vectors per job (``<prefix>.v1.results.<job>``), deduplicated by message id;
- ``<P>_DEAD``: dead letters (``<prefix>.v1.dead.<job>``): batches given up, kept with the stage, the
  reason and the number of deliveries in headers, so they can be inspected and published again;
- ``<P>_jobs`` key-value bucket: one JSON state per job.
All in file storage, created idempotently by whichever service starts first. The results stream and
the bucket expire what they hold after the limits of ``Retention`` (shared/config.py).
"""

from __future__ import annotations

import logging
import re

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, BadRequestError, BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from shared.config import ConfigError, JobSettings, Retention
from shared.options import JOB_TTL, RESULTS_MAX_AGE
from shared.chunk_progress import fail_chunks, store_chunks
from shared.progress import CHUNK_LEDGER, LEDGER, Rows, account, accounted
from shared.subjects import Subjects

log = logging.getLogger("embedfleet.jobs")

PUBLISH_AHEAD = 1024  # job batches of a model that may wait for the tokenizers before a publisher waits
DUPLICATE_WINDOW = 600.0  # seconds a message id is remembered: redeliveries inside it are dropped
DEAD_MAX_AGE = 30 * 24 * 3600.0
MAX_DEAD_RECORDS = 100  # dead batches listed in a job's state (all are counted, and kept in <P>_DEAD)


def _base(subjects: Subjects) -> str:
    return subjects.prefix.replace(".", "_").replace("-", "_").upper()


def stream_names(subjects: Subjects) -> dict[str, str]:
    base = _base(subjects)
    return {"jobs": f"{base}_JOBS", "bulk": f"{base}_BULK", "results": f"{base}_RESULTS", "dead": f"{base}_DEAD",
            "kv": f"{base}_jobs"}


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
    results = await _stream_config(js, names["results"])
    results_age = _chosen(retention.results_max_age, results and results.max_age, RESULTS_MAX_AGE)
    results_bytes = _chosen(retention.results_max_bytes, results and results.max_bytes, 0)
    configs = [
        StreamConfig(name=names["jobs"], subjects=[f"{p}.v1.jobs.>"], retention=RetentionPolicy.WORK_QUEUE,
                     storage=StorageType.FILE, duplicate_window=DUPLICATE_WINDOW),
        StreamConfig(name=names["bulk"], subjects=[f"{p}.v1.bulk.>"], retention=RetentionPolicy.WORK_QUEUE,
                     storage=StorageType.FILE, duplicate_window=DUPLICATE_WINDOW),
        StreamConfig(name=names["results"], subjects=[f"{p}.v1.results.>"], retention=RetentionPolicy.LIMITS,
                     storage=StorageType.FILE, duplicate_window=_window(DUPLICATE_WINDOW, results_age),
                     max_age=results_age, max_bytes=results_bytes if results_bytes > 0 else -1),
        StreamConfig(name=names["dead"], subjects=[f"{p}.v1.dead.>"], retention=RetentionPolicy.LIMITS,
                     storage=StorageType.FILE, duplicate_window=DUPLICATE_WINDOW, max_age=DEAD_MAX_AGE),
    ]
    placement = Placement(js, retention.replicas)
    for config in configs:
        current = results if config.name == names["results"] else await _stream_config(js, _name(config))
        await placement.put(config, current)
    return await _ensure_bucket(js, names["kv"], retention, placement)


AUTO_REPLICAS = 3  # a majority survives one node's loss
# JetStream's answers that a stream's copies cannot be placed: no suitable peers, not enough
# resources, a server that is not clustered
_PLACEMENT_ERRORS = {10005, 10023, 10074}
STREAM_EXISTS = 10058  # a stream of that name is there with another config (made meanwhile by another process)


def clustered(js: JetStreamContext) -> bool:
    """Whether the server this client is connected to is one node of a cluster (its INFO names one)."""
    info = getattr(js._nc, "_server_info", None) or {}  # nats-py keeps the server's INFO here
    return bool(info.get("cluster"))


class Placement:
    """The replicas streams get, settled stream by stream: ``wanted`` (an option; None: automatic) and
    what the server accepts. Automatic replicas that the cluster cannot place fall back to one copy,
    said once in the log; wanted ones that it cannot place are a ConfigError."""

    def __init__(self, js: JetStreamContext, wanted: int | None) -> None:
        self._js = js
        self.wanted = wanted
        self.replicas = wanted or (AUTO_REPLICAS if clustered(js) else 1)

    def target(self, current: int | None) -> int:
        """The copies a stream having ``current`` (None: a new one) should have."""
        if current is None or self.wanted is not None:
            return self.replicas
        return max(self.replicas, current)  # automatic: never lowered

    async def put(self, config: StreamConfig, current: StreamConfig | None) -> None:
        """Create the stream ``config`` describes, or update it (``current``: its config as read), with
        the replicas it should have.

        An existing stream that already has these settings is added again, which the server answers
        from what it holds; an update, even of nothing, is a change the cluster's nodes agree on, and
        every process puts every stream at start, often while another has just made it. A stream
        whose settings differ is updated at once, without the add that the server would refuse."""
        if current is None:
            try:
                await self.create(_name(config), lambda n: self._js.add_stream(config.evolve(num_replicas=n)))
                return
            except BadRequestError as exc:
                if exc.err_code != STREAM_EXISTS:
                    raise
                current = await _stream_config(self._js, _name(config))
                assert current is not None  # the server said it exists
        changed = _differences(config, current)
        if not changed and self.target(current.num_replicas) == current.num_replicas:
            try:
                await self._js.add_stream(config.evolve(num_replicas=current.num_replicas))
                return
            except BadRequestError as exc:  # a setting this config leaves to the server's default differs
                if exc.err_code != STREAM_EXISTS:
                    raise
        if changed:
            log.info("stream %s exists with other settings (%s): updating it to these", config.name, ", ".join(changed))
        await self.update(_name(config), current.num_replicas or 1,  # a stream the server describes names its copies
                          lambda n: self._js.update_stream(config.evolve(num_replicas=n)))

    async def create(self, name: str, make):
        """``make(replicas)``: a new stream; with one copy when automatic replicas cannot be placed."""
        try:
            return await make(self.replicas)
        except APIError as exc:
            if exc.err_code not in _PLACEMENT_ERRORS or self.replicas == 1:
                raise
            if self.wanted is not None:
                raise ConfigError(f"--stream-replicas {self.wanted}: NATS cannot place {self.wanted} copies of "
                                  f"{name}: {exc.description}") from None
            log.warning("%s: NATS cannot place %d copies (%s): one copy, which a lost node takes with it",
                        name, self.replicas, exc.description)
            self.replicas = 1
            return await make(1)

    async def update(self, name: str, current: int, change):
        """``change(replicas)``: an existing stream updated; its replicas kept, and said so, when the
        server refuses to change them."""
        target = self.target(current)
        if target != current:
            log.info("%s: %d copies (was %d)", name, target, current)
        try:
            return await change(target)
        except APIError as exc:
            if target == current:
                raise
            log.warning("%s keeps %d copies: NATS refused %d (%s)", name, current, target, exc.description)
            return await change(current)


async def _ensure_bucket(js: JetStreamContext, bucket: str, retention: Retention, placement: Placement) -> KeyValue:
    """The job bucket, created with ``retention``'s limits or brought to those it sets, with the
    replicas ``placement`` settled."""
    stream = f"KV_{bucket}"
    current = await _stream_config(js, stream)
    ttl = _chosen(retention.job_ttl, current and current.max_age, JOB_TTL)
    history = _chosen(retention.job_history, current and current.max_msgs_per_subject, 1)
    if current is None:
        try:
            return await placement.create(stream, lambda n: js.create_key_value(
                bucket=bucket, history=history, ttl=ttl or None, storage=StorageType.FILE, replicas=n))
        except BadRequestError:  # created meanwhile by another process, with other limits
            current = await _stream_config(js, stream)
            assert current is not None  # the server said it exists
    replicas = placement.target(current.num_replicas)
    if abs((current.max_age or 0) - ttl) > 1e-3 or current.max_msgs_per_subject != history or \
            replicas != current.num_replicas:
        log.info("bucket %s: record ttl %.0fs, %d revisions a job (was %.0fs, %d)", bucket, ttl, history,
                 current.max_age or 0, current.max_msgs_per_subject)
        await placement.update(stream, current.num_replicas or 1, lambda n: js.update_stream(current.evolve(
            max_age=ttl, max_msgs_per_subject=history, duplicate_window=_window(current.duplicate_window, ttl),
            num_replicas=n)))
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
    import time

    try:
        marker = await js.get_last_msg(bucket_stream(subjects), f"$KV.{stream_names(subjects)['kv']}.{job}")
    except NotFoundError:
        return 0.0
    if (marker.headers or {}).get("KV-Operation") != "PURGE" or marker.time is None:
        return 0.0
    return max(0.0, marker.time.timestamp() + DUPLICATE_WINDOW - time.time())


def _differences(config: StreamConfig, current: StreamConfig) -> list[str]:
    """The settings ``config`` gives (its fields that are not None, replicas aside) that ``current`` has otherwise."""
    given = {k: v for k, v in config.as_dict().items() if k != "num_replicas"}
    have = current.as_dict()
    return sorted(k for k, v in given.items() if have.get(k) != v)


def _name(config: StreamConfig) -> str:
    """The stream's name: every config made here has one (nats-py's type leaves it optional)."""
    assert config.name is not None
    return config.name


async def _stream_config(js: JetStreamContext, name: str) -> StreamConfig | None:
    try:
        return (await js.stream_info(name)).config
    except NotFoundError:
        return None


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
        name=durable, durable_name=durable, filter_subject=subject, ack_policy=AckPolicy.EXPLICIT,
        ack_wait=settings.ack_wait, max_deliver=settings.max_deliver, num_replicas=0,
    )


_KV_KEY = re.compile(r"[-/_=.a-zA-Z0-9]+")
# a job id is a KV key and a token of subjects and message ids: short, so a control line stays far
# under the server's limit (4 KB) with the prefix around it
MAX_JOB_ID = 128
_CONFLICTS = 1000  # compare-and-set retries before a state update is given up


def has_state_key(job: str) -> bool:
    """Whether ``job`` can name a state entry (a KV key: dot-separated tokens, none empty); an untrusted
    id may not."""
    return (len(job) <= MAX_JOB_ID and bool(_KV_KEY.fullmatch(job)) and not job.startswith(".")
            and not job.endswith(".") and ".." not in job)


async def update_state(kv: KeyValue, job: str, change, patience: float = 300.0) -> dict:
    """Read-modify-write a job's JSON state with compare-and-set, retrying on a concurrent writer, and
    on a lost connection for up to ``patience`` seconds (the server may be restarting)."""
    import json

    from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

    from shared.retry import retry_transient

    if not has_state_key(job):
        raise ValueError(f"job id {job[:100]!r} cannot name a job state")

    async def attempt() -> dict:
        conflicts = 0
        while True:
            try:
                try:
                    entry = await kv.get(job)
                    assert entry.value is not None  # get() raises for a deleted record: a record has a value
                    state, revision = json.loads(entry.value), entry.revision
                except KeyNotFoundError:
                    state, revision = {"job": job}, None
                change(state)
                value = json.dumps(state).encode()
                if revision is None:
                    await kv.create(job, value)
                else:
                    await kv.update(job, value, last=revision)
                return state
            except (KeyWrongLastSequenceError, BadRequestError):
                conflicts += 1  # someone else wrote first: read again (a request the server always refuses ends)
                if conflicts > _CONFLICTS:
                    raise

    return await retry_transient(attempt, transient, patience, f"job {job}: state update")


async def read_state(kv: KeyValue, job: str) -> dict | None:
    """A job's state, or None when there is no such job."""
    import json

    from nats.js.errors import KeyNotFoundError

    try:
        value = (await kv.get(job)).value
        assert value is not None  # get() raises for a deleted record: a record has a value
        return json.loads(value)
    except KeyNotFoundError:
        return None


class JobConflict(Exception):
    """A job id that already names a job making another vector form: resuming it would mix forms."""


CANCELLED = "cancelled"
# the state's record of where the current run of a job started: {"started": unix time, "done",
# "failed", "tokens": the job's counts then}, so rates count this run's work over this run's time
RUN = "run"
FINISHED = ("done", "done_with_errors", CANCELLED)  # statuses a job keeps once it has one


class JobCancelled(JobConflict):
    """The job was cancelled: none of it is published again."""


class JobTaken(JobConflict):
    """The job id names a job made by another request (other documents, options, or another API key)."""


class _NoJob(Exception):
    pass


def was_cancelled(state: dict | None) -> str | None:
    """Why the job recorded as ``state`` cannot be submitted again (None: it can)."""
    if not state or state.get("status") != CANCELLED:
        return None
    job = state.get("job")
    return f"job {job} was cancelled: purge it (embedfleet jobs purge {job}) or give it another job id"


async def cancel_job(kv: KeyValue, job: str) -> dict | None:
    """Mark a job cancelled and return its state; None when there is no such job. Publishers stop
    before their next batch, tokenizers and workers drop its queued batches unprocessed (see
    ``shared.bulkwork.Cancellations``), and what was stored stays in the results stream. A job that
    already finished keeps its state."""
    import time

    def cancel(state: dict) -> None:
        if "documents" not in state:  # no such job (a state is created with its document count)
            raise _NoJob
        if state.get("status") not in FINISHED:
            state["status"] = CANCELLED
            state["cancelled"] = time.time()
            state.setdefault("finished", state["cancelled"])

    try:
        return await update_state(kv, job, cancel)
    except _NoJob:
        return None


def vector_kind(output: str, form: str) -> str:
    """What a job makes, in words: its form for dense vectors ("int8"), else the output too ("sparse float32")."""
    return form if output == "dense" else f"{output} {form}"


def job_form(state: dict) -> str:
    """The vectors the job recorded as ``state`` makes (jobs recorded before forms and outputs existed
    made dense float32)."""
    return vector_kind(state.get("output", "dense"), state.get("embedding_type", "float32"))


def form_conflict(state: dict | None, form: str, output: str = "dense") -> str | None:
    """Why the job recorded as ``state`` cannot go on making ``output`` vectors of ``form`` (None: it can)."""
    if not state or "model" not in state:
        return None  # no job yet
    if job_form(state) == vector_kind(output, form):
        return None
    return f"job {state.get('job')} makes {job_form(state)} vectors, not {vector_kind(output, form)}: give it another job id"


def record_error(state: dict, message: str) -> None:
    errors = state.setdefault("errors", [])
    if len(errors) < MAX_DEAD_RECORDS:
        errors.append(message[:500])


def count_done(state: dict, rows: Rows, tokens: int, chunks=None) -> int:
    """Stored ``rows``: counted as done unless they were counted before (a batch delivered again after
    its holder died between storing and counting), or the job was cancelled before they were: its
    counts stay as the cancel found them (``late_rows`` tells the storer to remove their result).
    ``chunks`` (a ChunkRows): the rows are chunks of a chunked job (shared/chunk_progress.py).
    Returns how many were new."""
    if state.get("status") == CANCELLED:
        return 0
    if chunks is not None:
        fresh = store_chunks(state, rows, chunks, tokens)
    else:
        fresh = account(state, rows)
        if fresh:
            state["done"] = state.get("done", 0) + fresh
            state["tokens"] = state.get("tokens", 0) + tokens
    settle(state)
    return fresh


def late_rows(state: dict, rows: Rows, chunked: bool = False) -> bool:
    """Whether stored ``rows`` (``chunked``: chunk rows) came after their job's cancel and were not
    counted before it: their result must go, so that what the results stream holds is what the job's
    state counts as done."""
    ledger = CHUNK_LEDGER if chunked else LEDGER
    return state.get("status") == CANCELLED and accounted(state, rows, ledger) < rows.count


def count_failed(state: dict, rows: Rows, record: dict, chunks=None) -> int:
    """Given-up ``rows`` (``chunks``: chunk rows of a chunked job, whose documents fail): counted as
    failed unless already accounted for, and the batch listed once (up to a limit); not once the job
    is cancelled (its counts stay as the cancel found them). Returns how many documents were new."""
    if state.get("status") == CANCELLED:
        return 0
    if chunks is not None:
        fresh = fail_chunks(state, rows, chunks)
    else:
        fresh = account(state, rows)
        state["failed"] = state.get("failed", 0) + fresh
    dead = state.setdefault("dead", [])
    place = (record.get("stage"), record.get("batch"), record.get("start"))
    if len(dead) < MAX_DEAD_RECORDS and all((d.get("stage"), d.get("batch"), d.get("start")) != place for d in dead):
        dead.append(record)
        record_error(state, f"{record.get('stage')}: batch {record.get('batch')}: {record.get('reason')}")
    settle(state)
    return fresh


def settle(state: dict) -> None:
    """Every document accounted for: the job is done (or done with errors when some were given up).
    A cancelled job stays cancelled."""
    import time

    total = state.get("documents")
    if state.get("status") == CANCELLED or not total or state.get("done", 0) + state.get("failed", 0) < total:
        return
    if state.get(SINK) and not state.get(SINK_DONE):  # done once its rows are in the store (shared/sinks/writer.py)
        return
    status = "done" if not state.get("failed") else "done_with_errors"
    if state.get("status") != status:
        state["status"] = status
        state.setdefault("finished", time.time())


async def submit(
    js: JetStreamContext, kv: KeyValue, subjects: Subjects, job: str, model: str,
    docs: list[tuple[str, str]], batch_size: int, options, source: str, tracer=None, claim=None, chunking=None,
    sink: dict | None = None,
) -> dict:
    """Record a job and publish its batches not yet published (so a resubmission resumes).

    Raises JobConflict when the job exists and makes another vector form than ``options.dtype``,
    JobTaken when it was made by another request than ``claim`` (a shared.job_requests.Claim; None:
    one without an owner, its digest made here), and JobCancelled when it is (or gets) cancelled: no
    batch is published after the cancellation is seen.
    ``tracer`` (a shared.tracing.Tracer) records the publishing as a span under the current trace
    context; every batch carries it, so the job's stages in every process are one trace.
    ``chunking`` (a shared.text_chunks.JobChunking): every document is cut into chunks, a vector each;
    the state records it (``chunking``), and the tokenizers count the chunks as they cut them.
    ``sink``: the store the job's rows go to (``SINK`` and what its writer needs), recorded with the
    job's first state, so the job is never done before its rows are in the store."""
    from shared.tracing import Tracer, current, headers_for

    span = (tracer or Tracer("jobs")).start("job publish", current(), "producer", job=job, documents=len(docs))
    with span:
        return await _publish(js, kv, subjects, job, model, docs, batch_size, options, source, headers_for(span.context),
                              claim, chunking, sink)


async def _publish(js: JetStreamContext, kv: KeyValue, subjects: Subjects, job: str, model: str,
                   docs: list[tuple[str, str]], batch_size: int, options, source: str, headers: dict | None,
                   claim, chunking, sink: dict | None) -> dict:
    import time

    from shared.job_requests import Claim, claim_problem, record_claim, request_digest
    from shared.protocol import JobBatch, encode
    from shared.quantize import WIRE_FORMS

    claim = claim or Claim(request_digest(model, docs, batch_size, options, chunking))
    batches = [docs[i : i + batch_size] for i in range(0, len(docs), batch_size)]
    form = WIRE_FORMS[options.dtype]

    def start(state: dict) -> None:
        problem = form_conflict(state, form, options.output) or was_cancelled(state)
        if problem:
            raise (JobCancelled if state.get("status") == CANCELLED else JobConflict)(problem)
        if taken := claim_problem(state, claim):
            raise JobTaken(taken)
        record_claim(state, claim)
        if state.get("status") not in FINISHED:  # a run starts (or resumes): its rates count from here
            state[RUN] = {"started": time.time(), "done": state.get("done", 0), "failed": state.get("failed", 0),
                          "tokens": state.get("tokens", 0)}
        state.update(model=model, input=source, documents=len(docs), batches=len(batches), embedding_type=form,
                     output=options.output)
        if chunking is not None:
            state["chunking"] = chunking.record()
        if sink:
            state.update(sink)
        state.setdefault("status", "running")
        state.setdefault("started", time.time())
        state.setdefault("published", 0)

    state = await update_state(kv, job, start)
    for i in range(state["published"], len(batches)):
        if i % 8 == 0:
            await _wait_for_room(js, subjects, model)
        if await _cancelled(kv, job):
            await update_state(kv, job, lambda s, n=i: s.update(published=max(s.get("published", 0), n)))
            raise JobCancelled(f"job {job} was cancelled after {i} of {len(batches)} batches were published")
        batch = JobBatch(job, i, model, [d for d, _ in batches[i]], [t for _, t in batches[i]], options, chunking)
        # the stream's acknowledgement of each publish is the backpressure
        await publish_durably(js, subjects.jobs(model), encode(batch), f"{job}:{i}", headers=headers)
        if i % 8 == 7 or i == len(batches) - 1:
            await update_state(kv, job, lambda s, n=i + 1: s.update(published=max(s.get("published", 0), n)))
    return state


async def _wait_for_room(js: JetStreamContext, subjects: Subjects, model: str) -> None:
    """Until fewer than ``PUBLISH_AHEAD`` job batches of ``model`` wait for the tokenizers: the jobs
    stream holds a window of a job, not all of it (a 100M-document job would be ~100 GB of text on
    every node holding a copy). A server that does not answer holds the publisher here too."""
    import asyncio

    from nats.errors import Error as NatsError

    subject = subjects.jobs(model)
    while True:
        try:
            info = await js.stream_info(stream_names(subjects)["jobs"], subjects_filter=subject)
            if (info.state.subjects or {}).get(subject, 0) < PUBLISH_AHEAD:
                return
        except (TimeoutError, NatsError) as exc:
            if not transient(exc):
                raise
            log.debug("jobs stream: %r", exc)
        await asyncio.sleep(0.2)


async def _cancelled(kv: KeyValue, job: str) -> bool:
    """Whether the job's state says cancelled; a server that does not answer says nothing (the
    publish after this waits for it anyway)."""

    from nats.errors import Error as NatsError

    try:
        return ((await read_state(kv, job)) or {}).get("status") == CANCELLED
    except (TimeoutError, NatsError):
        return False


async def publish_durably(js: JetStreamContext, subject: str, data: bytes, msg_id: str, headers: dict | None = None,
                          patience: float = 300.0):
    """Publish into a stream with a message id and wait for the stream's acknowledgement, trying again
    while the connection is lost for up to ``patience`` seconds (the id makes a repeat harmless)."""
    from shared.retry import retry_transient

    return await retry_transient(lambda: js.publish(subject, data, headers={**(headers or {}), "Nats-Msg-Id": msg_id}),
                                 transient, patience, f"publish {msg_id}")


def transient(exc: BaseException) -> bool:
    """A lost connection, a timeout or JetStream not ready yet: worth trying again. An API error that
    the server answered (a bad request, a limit) is not."""
    from nats.js.errors import APIError, ServiceUnavailableError

    return not isinstance(exc, APIError) or isinstance(exc, ServiceUnavailableError)


# a job's rows written to a vector store (reindex --sink): the store as shown (no password), the rows
# durably written by the current run, and while the store refuses them, its message and since when
SINK, SINK_ROWS, SINK_ERROR, SINK_DONE = "sink", "sink_rows", "sink_error", "sink_done"


def sink_waiting(state: dict, message: str, since: float) -> None:
    """The store refused a batch and the collector waits to write it again (unix time ``since``)."""
    state[SINK_ERROR] = {"message": message[:500], "since": since}


def sink_written(state: dict, rows: int) -> None:
    """``rows`` of the job are durably in the store: a wait for it, if any, is over."""
    state[SINK_ROWS] = max(rows, state.get(SINK_ROWS) or 0)  # a resumed run writes again what an earlier one did
    state.pop(SINK_ERROR, None)


def sink_finished(state: dict) -> None:
    """The last row is in the store and its index built: the job may be done now."""
    import time

    state.pop(SINK_ERROR, None)
    state[SINK_DONE] = time.time()
    settle(state)
