"""Publishing a bulk job: its state recorded (shared/jobs/state.py), then its batches published into the
jobs stream, a window at a time, each with a message id (``JOB:BATCH``) so a repeat is dropped.

``submit`` records the job, or finds it recorded: the same request again resumes its publishing where
it stopped (``published``), another form, another request or a cancelled job is refused (JobConflict
and its kinds), before anything is published. ``publish_durably``: one message into a stream, waiting
for the stream's acknowledgement through a lost connection (every stage publishes so).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from embedfleet.shared.jobs.batches import batch_starts
from embedfleet.shared.jobs.bucket import read_state, update_state
from embedfleet.shared.jobs.claims import make_claim, read_claim
from embedfleet.shared.jobs.documents import Document
from embedfleet.shared.jobs.image_docs import ImageDoc
from embedfleet.shared.jobs.requests import Claim, claim_problem, record_claim, request_digest
from embedfleet.shared.jobs.state import CANCELLED, FINISHED, RUNNING, JobState, Lease, Run
from embedfleet.shared.jobs.streams import stream_names
from embedfleet.shared.nats.retry import retry_transient, transient
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import JobBatch
from embedfleet.shared.sinks.base import Shape

log = logging.getLogger("embedfleet.jobs")

PUBLISH_AHEAD = 1024  # job batches of a model that may wait for the tokenizers before a publisher waits


class JobConflict(Exception):
    """A job id that already names a job making another vector form: resuming it would mix forms."""


class JobCancelled(JobConflict):
    """The job was cancelled: none of it is published again."""


class JobTaken(JobConflict):
    """The job id names a job made by another request (other documents, options, or another API key)."""


@dataclass(frozen=True, slots=True)
class JobSink:
    """The store a job's rows go to, as its first state records it: ``shown`` (no password); for the
    gateway's writer also the request's URL (``target``), the rows' ``shape`` and the writer's ``lease``."""

    shown: str
    target: str | None = None
    shape: Shape | None = None
    lease: Lease | None = None


def was_cancelled(state: JobState | None) -> str | None:
    """Why the job recorded as ``state`` cannot be submitted again (None: it can)."""
    if state is None or state.status != CANCELLED:
        return None
    return f"job {state.job} was cancelled: purge it (embedfleet jobs purge {state.job}) or give it another job id"


def vector_kind(output: str, form: str) -> str:
    """What a job makes, in words: its form for dense vectors ("int8"), else the output too ("sparse float32")."""
    return form if output == "dense" else f"{output} {form}"


def job_form(state: JobState) -> str:
    """The vectors the job recorded as ``state`` makes ("?" when no submission recorded it)."""
    if state.output is None or state.embedding_type is None:
        return "?"
    return vector_kind(state.output, state.embedding_type)


def form_conflict(state: JobState | None, form: str, output: str = "dense") -> str | None:
    """Why the job recorded as ``state`` cannot go on making ``output`` vectors of ``form`` (None: it can)."""
    if state is None or not state.submitted or job_form(state) == vector_kind(output, form):
        return None  # no job yet, or the same vectors
    return f"job {state.job} makes {job_form(state)} vectors, not {vector_kind(output, form)}: give it another job id"


async def submit(
    js: JetStreamContext,
    kv: KeyValue,
    subjects: Subjects,
    job: str,
    model: str,
    docs: Sequence[Document],
    batch_size: int,
    options,
    source: str,
    tracer=None,
    claim=None,
    chunking=None,
    sink: JobSink | None = None,
    submitter: str = "gateway",
    batch_bytes: int = 0,
) -> JobState:
    """Record a job and publish its batches not yet published (so a resubmission resumes).

    Raises JobConflict when the job exists and makes another vector form than ``options.dtype``,
    JobTaken when it was made by another request than ``claim`` (an embedfleet.shared.jobs.requests.Claim; None:
    one without an owner, its digest made here), and JobCancelled when it is (or gets) cancelled: no
    batch is published after the cancellation is seen.
    ``tracer`` (an embedfleet.shared.observability.tracing.Tracer) records the publishing as a span under the current trace
    context; every batch carries it, so the job's stages in every process are one trace.
    ``chunking`` (an embedfleet.shared.text_chunks.JobChunking): every document is cut into chunks, a vector each;
    the state records it, and the tokenizers count the chunks as they cut them.
    ``sink``: the store the job's rows go to, recorded with the job's first state, so the job is never
    done before its rows are in the store. ``submitter`` ("gateway" or "publisher", the role of this
    process's NATS user): the job is claimed under that name (shared/jobs/claims.py) before anything is
    recorded, and every batch is signed with the claim's secret. ``docs``: (id, text) pairs, or (id,
    ImageDoc) for a job of images, whose batches are cut by ``batch_bytes`` too (shared/jobs/batches.py)
    and whose files are read as each batch is published."""
    from embedfleet.shared.observability.tracing import Tracer, current, headers_for

    span = (tracer or Tracer("jobs")).start("job publish", current(), "producer", job=job, documents=len(docs))
    with span:
        return await _publish(
            js,
            kv,
            subjects,
            job,
            model,
            docs,
            batch_size,
            options,
            source,
            headers_for(span.context),
            claim,
            chunking,
            sink,
            submitter,
            batch_bytes,
        )


async def _publish(
    js: JetStreamContext,
    kv: KeyValue,
    subjects: Subjects,
    job: str,
    model: str,
    docs: Sequence[Document],
    batch_size: int,
    options,
    source: str,
    headers: dict | None,
    claim,
    chunking,
    sink: JobSink | None,
    submitter: str,
    batch_bytes: int,
) -> JobState:
    from embedfleet.shared.protocol import encode

    claim = claim or Claim(request_digest(model, docs, batch_size, options, chunking, batch_bytes))
    proof = await read_claim(js, subjects, submitter, job)
    if proof is None:
        existing = await read_state(kv, job)
        if existing is not None and existing.submitted:  # its batches are signed with another's secret
            raise JobTaken(
                f"job {job} was submitted another way (POST /v1/jobs or `embedfleet reindex`, or by an earlier "
                "version): resume it the way it was made, or give it another job id"
            )
        proof = await make_claim(js, subjects, submitter, job, claim.owner)
    # the owner, once claimed, is the job's for good: another key's request for the same id is refused
    # (a claim without an owner resumes a job its caller may see, whoever made it)
    if claim.owner is not None and proof.owner != claim.owner:
        raise JobTaken(f"job id {job} is taken: give another job id")
    starts = batch_starts(docs, batch_size, batch_bytes)
    batches = [docs[a:b] for a, b in itertools.pairwise(starts)]
    form = options.form

    def start(state: JobState) -> JobState:
        problem = form_conflict(state, form, options.output) or was_cancelled(state)
        if problem:
            raise (JobCancelled if state.status == CANCELLED else JobConflict)(problem)
        if taken := claim_problem(state, claim):
            raise JobTaken(taken)
        now = time.time()
        state = record_claim(state, claim)
        if state.status not in FINISHED:  # a run starts (or resumes): its rates count from here
            state = replace(state, run=Run(now, state.done, state.failed, state.tokens))
        if sink is not None:
            state = replace(
                state, sink=sink.shown, sink_target=sink.target, sink_shape=sink.shape, sink_lease=sink.lease
            )
        return replace(
            state,
            model=model,
            input=source,
            documents=len(docs),
            batches=len(batches),
            embedding_type=form,
            output=options.output,
            chunking=chunking if chunking is not None else state.chunking,
            status=state.status or RUNNING,
            started=state.started or now,
        )

    state = await update_state(kv, job, start)
    for i in range(state.published, len(batches)):
        if i % 8 == 0:
            await _wait_for_room(js, subjects, model)
        if await _cancelled(kv, job):
            await update_state(kv, job, _published(i))
            raise JobCancelled(f"job {job} was cancelled after {i} of {len(batches)} batches were published")
        body = encode(await _job_batch(job, i, model, batches[i], options, chunking))
        # the stream's acknowledgement of each publish is the backpressure
        await publish_durably(
            js, subjects.jobs(model), body, f"{job}:{i}", headers={**(headers or {}), **proof.sign(body)}
        )
        if i % 8 == 7 or i == len(batches) - 1:
            await update_state(kv, job, _published(i + 1))
    return state


async def _job_batch(job: str, i: int, model: str, docs: Sequence[Document], options, chunking) -> JobBatch:
    """Batch ``i`` of a job: its documents' texts, or their images' files (read off the event loop)."""
    ids = [d for d, _ in docs]
    if not docs or isinstance(docs[0][1], str):
        return JobBatch(job, i, model, ids, [t for _, t in docs if isinstance(t, str)], options, chunking)
    files = await asyncio.to_thread(lambda: [image.read() for _, image in docs if isinstance(image, ImageDoc)])
    return JobBatch(job, i, model, ids, [], options, images=files)


def _published(batches: int) -> Callable[[JobState], JobState]:
    """A state change: at least ``batches`` batches published."""
    return lambda s: replace(s, published=max(s.published, batches))


async def _wait_for_room(js: JetStreamContext, subjects: Subjects, model: str) -> None:
    """Until fewer than ``PUBLISH_AHEAD`` job batches of ``model`` wait for the tokenizers: the jobs
    stream holds a window of a job, not all of it (a 100M-document job would be ~100 GB of text on
    every node holding a copy). A server that does not answer holds the publisher here too."""
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
    try:
        state = await read_state(kv, job)
    except (TimeoutError, NatsError):
        return False
    return state is not None and state.status == CANCELLED


async def publish_durably(
    js: JetStreamContext, subject: str, data: bytes, msg_id: str, headers: dict | None = None, patience: float = 300.0
):
    """Publish into a stream with a message id and wait for the stream's acknowledgement, trying again
    while the connection is lost for up to ``patience`` seconds (the id makes a repeat harmless)."""
    return await retry_transient(
        lambda: js.publish(subject, data, headers={**(headers or {}), "Nats-Msg-Id": msg_id}),
        transient,
        patience,
        f"publish {msg_id}",
    )
