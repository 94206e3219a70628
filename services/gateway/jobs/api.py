"""The bulk jobs' manager behind their HTTP routes (serving.py): POST /v1/jobs submits one (inline documents or
a file on the server; its body a JobBody, body.py), GET /v1/jobs pages through the caller's (listing.py), GET
/v1/jobs/{id} returns its state, DELETE /v1/jobs/{id} cancels it. The
vectors go to the results stream, as for `embedfleet reindex`. With ``chunking`` (``{"size", "overlap", "boundary", "late"}``) the
tokenizers cut each document into chunks, a vector each (``with_text``: each chunk's text stored too).
With ``sink`` (a store the gateway's --job-sinks allows) the gateway writes the rows into it as they
come (services/gateway/jobs/sinks.py): an inline document's other fields are its row's metadata. A job's
documents may be images instead of texts, for a two-tower model (documents.py; its batches cut by bytes:
shared/jobs/batches.py)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from embedfleet.services.gateway.http.body_errors import read_body
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.http.limits import KeyLimits
from embedfleet.services.gateway.inputs import within_document_chars
from embedfleet.services.gateway.jobs.body import DEFAULT_BATCH, JobBody
from embedfleet.services.gateway.jobs.documents import check_image_job, inline_documents, inline_images
from embedfleet.services.gateway.jobs.files import read_job_file
from embedfleet.services.gateway.jobs.listing import JobListQuery, page_answer, read_page
from embedfleet.services.gateway.jobs.owners import JobOwners
from embedfleet.services.gateway.jobs.sinks import SinkJobs
from embedfleet.services.gateway.jobs.tokens import JobTokens
from embedfleet.shared.config.registry import default
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.images.decode import ImageLimits
from embedfleet.shared.jobs.batches import batch_room
from embedfleet.shared.jobs.bucket import read_state
from embedfleet.shared.jobs.collector import Layout
from embedfleet.shared.jobs.documents import Document, images_of, job_id_for, read_fields, texts_of
from embedfleet.shared.jobs.fit import (
    BatchFit,
    JobRefused,
    JobTooLarge,
    check_chunk_room,
    check_job,
    served,
)
from embedfleet.shared.jobs.ids import new_job_id_problem
from embedfleet.shared.jobs.progress import Ledger
from embedfleet.shared.jobs.publish import JobCancelled, JobConflict, JobSink, form_conflict, submit, was_cancelled
from embedfleet.shared.jobs.requests import Claim, claim_problem, request_digest
from embedfleet.shared.jobs.sink_writer import Sources, shape_for
from embedfleet.shared.jobs.state import JOB_OUTPUTS, RUNNING, JobState
from embedfleet.shared.jobs.status import cancel_job
from embedfleet.shared.jobs.streams import DUPLICATE_WINDOW, purge_wait
from embedfleet.shared.nats.fleet import FleetView
from embedfleet.shared.protocol import EmbedOptions
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking
from embedfleet.shared.vectors.forms import EMBEDDING_TYPES, FORMS

log = logging.getLogger("embedfleet.gateway.jobs")


def check_job_id(job: object) -> str:
    """``job`` when it can name a new job; else ApiError 400 (param ``id``). The rule is the one
    ``embedfleet reindex --job-id`` follows too (shared/jobs/ids.py), checked at the edge: an id that cannot
    name a job is refused at once, and so is one with a ``/``, which the job's routes could not take
    (``/v1/jobs/q/results`` is job ``q``'s results)."""
    if not isinstance(job, str):
        raise ApiError(ErrorCode.INVALID_REQUEST, "'id' must be a string", "id")
    problem = new_job_id_problem(job)
    if problem:
        raise ApiError(ErrorCode.INVALID_REQUEST, problem, "id")
    return job


def parse_job(body: bytes) -> JobBody:
    """The submission ``body`` holds, its fields each checked; ApiError (400 naming the field) otherwise."""
    return read_body(JobBody, body)


class JobsApi:
    def __init__(
        self,
        js,
        kv,
        subjects,
        jobs_dir: Path | None,
        tracer=None,
        owners: JobOwners | None = None,
        max_file_bytes: int = default("jobs_max_file_bytes"),
        sinks: SinkJobs | None = None,
        limits: KeyLimits | None = None,
        max_document_chars: int = default("max_document_chars"),
        max_result_bytes: int = default("job_max_result_bytes"),
        counted: Callable[[str, int], None] | None = None,
        image_limits: ImageLimits | None = None,
    ) -> None:
        self._js, self._kv, self._subjects = js, kv, subjects
        self._tracer = tracer  # the job's publishing is a span of the request's trace
        self._jobs_dir = jobs_dir  # the only folder whose files a request may name
        self._max_file_bytes = max_file_bytes
        self._max_document_chars = max_document_chars  # a document's characters: tokenizing costs ~250 B each
        self._max_result_bytes = max_result_bytes  # the results one job may store (0: no limit)
        self._image_limits = image_limits or ImageLimits()  # a job's images, by their headers (--max-image-*)
        self._owners = owners or JobOwners(False, ())
        self._sinks = sinks  # None: no store is written (the gateway's --job-sinks is not set)
        # a job's tokens charged to its key's budget, and ``counted`` to its usage, as they are counted
        self._tokens = JobTokens(kv, limits or KeyLimits(), counted)
        self._background: set[asyncio.Task] = set()

    async def create(
        self, doc: JobBody, model: str, fleet: FleetView | None = None, max_payload: int = 0, chunker=None
    ) -> tuple[int, dict]:
        """The job ``doc`` (parse_job's) asks for. ``fleet`` (what serves now) and ``max_payload`` (the NATS message limit): the job is checked
        against them (shared/jobs/fit.py) before anything is published; its batches cut to fit.
        ``chunker`` (an EmbedClient): a tokenizer it asks says whether a chunked job's windows fit the
        model. A job of that id already there: the same request again answers its state (200, resumed
        if it was not all published), any other 409."""
        options, form, chunking = job_options(doc)
        with_text = bool(doc.with_text)
        if doc.id is not None:
            check_job_id(doc.id)
        # everything is checked before the first batch is published: the fields above, every document, the id
        if doc.documents is not None and doc.path is not None:
            raise ApiError(ErrorCode.INVALID_REQUEST, "give 'documents' or 'path', not both", "path")
        if doc.documents is not None:
            docs, fields = (
                inline_documents(doc.documents)
                if doc.documents[0].image is None
                else inline_images(doc.documents, self._image_limits)
            )
            source, path = "inline", None
        elif doc.path is not None:
            if self._jobs_dir is None:
                raise ApiError(
                    ErrorCode.INVALID_REQUEST,
                    "server-side files are off here (the gateway's --jobs-dir is not set)",
                    "path",
                )
            file = await read_job_file(self._jobs_dir, doc.path, self._max_file_bytes, self._image_limits)
            docs, source, path = file.docs, file.given, file.path
            fields = await asyncio.to_thread(read_fields, path) if doc.sink is not None else None
        else:
            raise ApiError(
                ErrorCode.INVALID_REQUEST,
                "give 'documents' ([{\"id\", \"text\"}]) or 'path' (a file on the server)",
                "documents",
            )
        images = images_of(docs)
        if images is not None:
            check_image_job(options, chunking, with_text)
        within_document_chars(docs, self._max_document_chars)
        batch_size = DEFAULT_BATCH if doc.batch_size is None else doc.batch_size
        limit = self._max_result_bytes
        fit = _fitted(fleet, model, options, batch_size, max_payload, docs, chunking, limit)
        batch_size, note, batch_bytes = fit.batch_size, fit.note, fit.batch_bytes
        if chunking is not None and chunker is not None:
            try:
                await check_chunk_room(chunker, model, chunking, options)
            except JobRefused as exc:
                raise ApiError(ErrorCode.INVALID_REQUEST, str(exc), exc.field) from None
        job = doc.id or (
            job_id_for(path, model, batch_size, form, options.output, chunking, batch_bytes)
            if path
            else uuid.uuid4().hex[:16]
        )
        claim = Claim(
            await asyncio.to_thread(request_digest, model, docs, batch_size, options, chunking, batch_bytes),
            self._owners.owner(),
        )
        existing = await self._existing(job, claim, form, options.output)
        if existing is not None and existing.sink_target != (given := doc.sink):
            raise ApiError(
                ErrorCode.CONFLICT,
                f"job {job} writes into {existing.sink or 'no store'}, not {given or 'none'}: give another 'id'",
                "sink",
            )
        if existing is not None and existing.published >= existing.batches:
            return 200, _shown(existing)
        if existing is not None:  # the caller sees it (checked): its publishing resumes whoever made it
            claim = Claim(claim.request)
        # a new job's tokens, estimated, taken from its key's budget before any work (tokens.py); an image
        # counts as an empty text here, the tokens its tower runs charged as its batches are counted
        taken = self._tokens.admit(t if isinstance(t, str) else "" for _, t in docs) if existing is None else None
        store = None
        if doc.sink is not None:  # opened (its table made) before anything is published; the gateway writes it
            texts = {d: t for d, t in docs if isinstance(t, str)} if with_text and chunking is None else None
            sources = Sources(fields, texts)
            try:
                store = await self._store(doc.sink, fleet, model, form, options, chunking, job, docs, sources)
            except BaseException:
                self._tokens.cancel(taken)
                raise
        try:
            record = None
            if store is not None:
                assert self._sinks is not None  # _store refuses a sink without them
                record = self._sinks.record(store[0], store[1], store[2])
            if path is None:
                published = await self._submit(
                    job, model, docs, (batch_size, batch_bytes), options, source, claim, chunking, record
                )
                status = published.status
            else:  # a file may be large: publish in the background, answer at once
                task = asyncio.create_task(
                    submit(
                        self._js,
                        self._kv,
                        self._subjects,
                        job,
                        model,
                        docs,
                        batch_size,
                        options,
                        source,
                        self._tracer,
                        claim,
                        chunking,
                        record,
                        batch_bytes=batch_bytes,
                    )
                )
                self._background.add(task)
                task.add_done_callback(self._done)
                status = RUNNING
        except BaseException:
            self._tokens.cancel(taken)
            if store is not None:
                await asyncio.to_thread(store[1].close)
            raise
        self._tokens.watch(job, taken)
        if store is not None:
            assert self._sinks is not None  # _store refuses a sink without them
            self._sinks.write(job, store[1], store[2], sources, Layout.of(docs, batch_size, batch_bytes))
        if existing is not None:
            return 200, _shown(await read_state(self._kv, job) or existing)
        return 202, {
            "id": job,
            "status": status,
            "documents": len(docs),
            "model": model,
            "embedding_type": form,
            "batch_size": batch_size,
            **({"note": note} if note else {}),
            **({"chunking": chunking.record()} if chunking else {}),
            **({"sink": store[1].shown} if store else {}),
        }

    async def _store(
        self,
        given: str,
        fleet: FleetView | None,
        model: str,
        form: str,
        options: EmbedOptions,
        chunking: JobChunking | None,
        job: str,
        docs,
        sources: Sources,
    ):
        """The store a job's ``sink`` (``given``) names, opened for its rows, and their sources kept beside
        its results: (the request's URL, the sink, the rows' shape)."""
        if self._sinks is None:
            raise ApiError(
                ErrorCode.INVALID_REQUEST,
                "jobs are not written into stores here (the gateway's --job-sinks is not set)",
                "sink",
            )
        self._sinks.targets.granted(given)  # a store or table not allowed: refused before anything else is done
        messages = self._sinks.sources_messages([d for d, _ in docs], sources)
        try:
            shape = shape_for(served(fleet, model), form, options.output, chunking is not None) if fleet else None
        except JobRefused as exc:
            raise ApiError(ErrorCode.INVALID_REQUEST, str(exc), exc.field) from None
        if shape is None:
            raise ApiError(ErrorCode.NO_RESPONDERS, "the fleet's models are not known yet: try again", "model")
        given, sink = await self._sinks.open(given, shape)
        try:
            await self._sinks.keep(job, messages)
        except BaseException:
            await asyncio.to_thread(sink.close)
            raise
        return given, sink, shape

    async def _submit(
        self,
        job: str,
        model: str,
        docs,
        batching: tuple[int, int],
        options,
        source: str,
        claim: Claim,
        chunking: JobChunking | None,
        sink: JobSink | None = None,
    ) -> JobState:
        """``batching``: (documents, a job of images' bytes) a batch (shared/jobs/batches.py)."""
        batch_size, batch_bytes = batching
        try:
            return await submit(
                self._js,
                self._kv,
                self._subjects,
                job,
                model,
                docs,
                batch_size,
                options,
                source,
                self._tracer,
                claim,
                chunking,
                sink,
                batch_bytes=batch_bytes,
            )
        except JobCancelled as exc:  # as _existing answers it
            raise ApiError(ErrorCode.INVALID_REQUEST, str(exc), "id") from None
        except JobConflict as exc:  # created meanwhile by another request, or another form: as _existing answers it
            raise ApiError(ErrorCode.CONFLICT, str(exc), "id") from None

    async def _existing(self, job: str, claim: Claim, form: str, output: str) -> JobState | None:
        """The state of the job ``job`` names when it is this same request's (None: no job yet). A job
        that another key made is taken (409, nothing of it told); one cancelled is refused (400), one
        made by another request (other documents, model, form or batch size) is a conflict (409)."""
        state = await read_state(self._kv, job)
        if state is None or not state.submitted:
            wait = await purge_wait(self._js, self._subjects, job) if state is None else 0.0
            if wait:  # the streams would drop its batches as repeats of the purged run's
                raise ApiError(
                    ErrorCode.INVALID_REQUEST,
                    f"job {job} was purged less than {DUPLICATE_WINDOW:.0f}s ago: "
                    f"submit it again in {wait:.0f}s, or give another 'id'",
                    "id",
                )
            return None
        if not self._owners.sees(state):
            raise ApiError(ErrorCode.CONFLICT, f"job id {job} is taken: give another 'id'", "id")
        if problem := was_cancelled(state):
            raise ApiError(ErrorCode.INVALID_REQUEST, problem, "id")
        if problem := form_conflict(state, form, output) or claim_problem(state, Claim(claim.request)):
            raise ApiError(ErrorCode.CONFLICT, problem, "id")
        return state

    async def _visible(self, job: str, state: JobState | None) -> JobState:
        """``state`` when the caller may see it; else 404, as for no job at all."""
        if state is None or not state.submitted or not self._owners.sees(state):
            raise ApiError(ErrorCode.NOT_FOUND, f"no job {job!r}", "id")
        return state

    async def get(self, job: str) -> dict:
        return _shown(await self._visible(job, await read_state(self._kv, job)))

    async def page(self, query: JobListQuery) -> dict:
        """A page of the jobs the caller may see (GET /v1/jobs, listing.py)."""
        states, more = await read_page(self._js, self._kv, self._subjects, self._owners, query)
        return page_answer([_shown(state) for state in states], more)

    async def cancel(self, job: str) -> dict:
        """Cancel a job; its state as it stands after (a finished job's is unchanged)."""
        await self._visible(job, await read_state(self._kv, job))
        state = await cancel_job(self._kv, job)
        if state is None:
            raise ApiError(ErrorCode.NOT_FOUND, f"no job {job!r}", "id")
        return _shown(state)

    async def stop(self) -> None:
        """Stop following the running jobs' tokens (what they were charged stays charged)."""
        await self._tokens.stop()

    def _done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if task.cancelled() or not task.exception():
            return
        if isinstance(task.exception(), JobConflict):
            log.info("%s", task.exception())
        else:
            log.error("submitting a job failed: %s", task.exception())


def job_options(doc: JobBody) -> tuple[EmbedOptions, str, JobChunking | None]:
    """What the fields of a submission ask for together: the options, the form's name and the chunking;
    ApiError (400) for fields that do not go together."""
    options, form = _options(doc)
    return options, form, _chunking(doc, options)


def _options(doc: JobBody) -> tuple[EmbedOptions, str]:
    """The options and the form name a job's submission asks for; a sparse job's form floating."""
    form = EMBEDDING_TYPES[doc.embedding_type or "float"].name
    output = doc.output or JOB_OUTPUTS[0]
    if output == "sparse" and not FORMS[form].floating:
        raise ApiError(ErrorCode.INVALID_REQUEST, "sparse values are float32 or float16", "embedding_type")
    return EmbedOptions(input_type=doc.input_type, dtype=FORMS[form].wire, output=output), form


def _chunking(doc: JobBody, options: EmbedOptions) -> JobChunking | None:
    """The job's ``chunking`` and ``with_text`` fields, checked together (None: a vector a document)."""
    parsed, with_text = doc.chunking, bool(doc.with_text)
    if parsed is None:
        if with_text and doc.sink is None:  # a store keeps each document's text; the results stream only a chunk's
            raise ApiError(
                ErrorCode.INVALID_REQUEST, "'with_text' stores each chunk's text: give 'chunking' too", "with_text"
            )
        return None
    if options.output != "dense":
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"a chunked job makes a dense vector a chunk, not {options.output} vectors",
            "chunking",
        )
    try:
        spec = ChunkSpec(parsed.size, parsed.overlap, parsed.boundary)
    except ServiceError as exc:  # an overlap not below the size
        raise ApiError(exc.code, exc.message, "chunking") from None
    return JobChunking(spec, parsed.late, with_text)


def _fitted(
    fleet: FleetView | None,
    model: str,
    options: EmbedOptions,
    batch_size: int,
    max_payload: int,
    docs: Sequence[Document],
    chunking: JobChunking | None = None,
    max_result_bytes: int = 0,
) -> BatchFit:
    """The batch size the job runs with, why it is smaller than asked, and a job of images' bytes a
    batch; what the fleet cannot run is refused (400; 413 for an image no batch can carry) before
    anything is published."""
    images = images_of(docs)
    if fleet is None:
        return BatchFit(batch_size, None, batch_room(max_payload) if images is not None else 0)
    try:
        ids, chars = [d for d, _ in docs], [len(t) for t in texts_of(docs)]
        return check_job(fleet, model, options, batch_size, max_payload, ids, chunking, chars, max_result_bytes, images)
    except JobTooLarge as exc:
        raise ApiError(ErrorCode.PAYLOAD_TOO_LARGE, str(exc), exc.field) from None
    except JobRefused as exc:
        raise ApiError(ErrorCode.INVALID_REQUEST, str(exc), exc.field) from None


def _shown(state: JobState) -> dict:
    """A job's state as the API shows it: its record with ``id`` for ``job``, without the ledgers of
    counted rows, the digest of its owner's key or the lease of the gateway writing its store."""
    private = replace(state, accounted=Ledger(), accounted_chunks=Ledger(), cut=Ledger(), owner=None, sink_lease=None)
    shown = private.record()
    shown["id"] = shown.pop("job")
    return shown
