"""A reindex run's plan: the options, the output, every document and the job's recorded state checked
before the first batch is published (services/jobs/reindex.py runs it).

The job id is derived from the input, the model, the form and the chunking (shared/jobs/documents.py), so
running the same command again after it was killed finds the same job; what its recorded state says
(another form or input, cancelled, results expired, purged a moment ago) can refuse the run here.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path

from embedfleet.services.jobs.chunking import check_room, chunking_of
from embedfleet.services.jobs.files import check_output_path
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.images.decode import ImageLimits
from embedfleet.shared.jobs.bucket import read_state
from embedfleet.shared.jobs.documents import Document, images_of, job_id_for, read_input, texts_of
from embedfleet.shared.jobs.fit import JobRefused, check_job, fleet_view, served
from embedfleet.shared.jobs.ids import new_job_id_problem
from embedfleet.shared.jobs.publish import form_conflict, was_cancelled
from embedfleet.shared.jobs.requests import Claim, claim_problem, request_digest
from embedfleet.shared.jobs.settings import Retention, retention
from embedfleet.shared.jobs.sink_writer import shape_for
from embedfleet.shared.jobs.state import JobState
from embedfleet.shared.jobs.streams import DUPLICATE_WINDOW, open_streams, purge_wait, stream_names
from embedfleet.shared.nats.config import NatsConfig
from embedfleet.shared.nats.fleet import FleetWatch
from embedfleet.shared.nats.lifecycle import connect_within
from embedfleet.shared.nats.local_stack import LocalStack, NoDefaultModel, default_model
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.observability.tracing import TracingConfig
from embedfleet.shared.protocol import EmbedOptions, ProtocolError
from embedfleet.shared.sinks import Shape, checked_sink
from embedfleet.shared.text_chunks import JobChunking
from embedfleet.shared.vectors.forms import FORMS, form_named


@dataclass(frozen=True)
class Plan:
    """A reindex run, every part checked before anything is published."""

    path: Path
    out: Path | None  # None: rows go to the sink only
    form: str  # a vector form's name (shared/vectors/forms.py)
    output: str  # "dense", "sparse" or "multivector"
    options: EmbedOptions
    tracing: TracingConfig
    docs: list[Document]  # (id, text or image), in input order
    job: str
    batch_size: int
    chunking: JobChunking | None  # None: a vector a document
    model: str  # --model (else the stack's default model: model_of): the served model the job asks for
    job_given: str | None  # --job-id; None: ``job`` is derived from the input and options
    retention: Retention  # set on the streams the run meets
    results_check: float  # --results-check: seconds between looks at the stored results
    stall_timeout: float  # --stall-timeout
    quiet: bool  # --quiet: no progress bar
    with_text: bool  # --with-text: the sink's rows keep their texts
    sink: str | None = None  # --sink URL
    shape: Shape | None = None  # the sink's rows, once the fleet said the model's dimension
    batch_bytes: int = 0  # a job of images: the bytes of files a batch carries at most (shared/jobs/batches.py)

    def for_model(self, model: str) -> Plan:
        """This run for ``model`` (``model_of``'s answer where --model was not given), its job id derived
        from it unless --job-id named one."""
        if model == self.model and self.job:
            return self
        return replace(self, model=model, job=self._job_id(model, self.batch_size, self.batch_bytes))

    def _job_id(self, model: str, batch_size: int, batch_bytes: int) -> str:
        """--job-id, else the id derived from the input and the options (shared/jobs/documents.py)."""
        return self.job_given or job_id_for(
            self.path, model, batch_size, self.form, self.output, self.chunking, batch_bytes
        )


def plan_of(ns: argparse.Namespace) -> Plan:
    """The run the options ask for, checked without NATS: the output, the form and output kind, the
    chunking, every document read, the job id."""
    path, out = Path(ns.input), Path(ns.out) if ns.out else None
    if out is None and not ns.sink:
        raise ConfigError("give --out FILE, --sink URL (a vector store), or both")
    if ns.sink:
        checked_sink(ns.sink, "--sink")  # its scheme, parameters and client, before anything is read
    form = form_named(ns.embedding_type).name
    output = ns.output
    try:
        options = EmbedOptions(input_type=ns.input_type, dtype=FORMS[form].wire, output=output)
    except ProtocolError as exc:
        raise ConfigError(str(exc).replace("options.", "")) from None
    chunking = chunking_of(ns, output)
    if out is not None:
        check_output_path(out, output, chunking is not None)
    tracing = TracingConfig.from_namespace(ns)
    docs = read_input(path, ImageLimits(ns.max_image_bytes, ns.max_image_pixels))  # all of them, each checked
    if images_of(docs) is not None:
        _check_image_job(path, output, chunking, ns.with_text)
    if ns.job_id:
        problem = new_job_id_problem(ns.job_id)
        if problem:
            raise ConfigError(f"--job-id: {problem}")
    # the model (and the job id derived from it) is the fleet's to say where --model is not given: for_model
    job = ns.job_id or (job_id_for(path, ns.model, ns.batch_size, form, output, chunking) if ns.model else "")
    return Plan(
        path,
        out,
        form,
        output,
        options,
        tracing,
        docs,
        job,
        ns.batch_size,
        chunking,
        ns.model or "",
        ns.job_id,
        retention(ns),
        ns.results_check,
        ns.stall_timeout,
        ns.quiet,
        ns.with_text,
        ns.sink,
    )


def _check_image_job(path: Path, output: str, chunking: JobChunking | None, with_text: bool) -> None:
    """ConfigError for what a job of images cannot do: sparse vectors, chunks, texts. Dense or multivector
    is the model's to say (a two-tower model's images are dense, a page model's multivector): the fleet
    is asked (check_job) before anything is published."""
    what = (
        "--with-text: an image has no text to store (its row keeps its id and the input's other fields)"
        if with_text
        else "--chunk-size: chunks are cut from texts; an image is one vector"
        if chunking is not None
        else f"--output {output}: images make dense vectors only (a page model's: multivector)"
        if output not in ("dense", "multivector")
        else None
    )
    if what is not None:
        raise ConfigError(f"{path} is a job of images; {what}")


async def model_of(given: str | None, stack: LocalStack | None, nats: NatsConfig) -> str:
    """The model a reindex asks for: --model; else the default model of the stack `up` recorded (its
    gateway's); else the fleet's only model, asked (a URL given: no record says which it is)."""
    if given:
        return given
    if stack is not None and stack.default_model:
        return stack.default_model
    nc = await connect_within(nats, "embedfleet-reindex")
    try:
        watch = FleetWatch(nc, nats.subjects.prefix, wait=0.5, interval=1.0)
        # twice: a busy process may answer a ping late, and a model missed would leave another the only one
        served = sorted(set((await watch.refresh()).models) | set((await watch.refresh()).models))
    finally:
        await nc.close()
    try:
        return default_model(served, None)
    except NoDefaultModel as exc:
        raise ConfigError(f"{exc} with --model; nothing was published") from None


async def _fitted(nc, prefix: str, plan: Plan) -> Plan:
    """The plan once the fleet can run it: the model served, the output one it makes, the batch size
    cut (and said so) where a batch's vectors could outgrow a NATS message."""
    view = await fleet_view(nc, prefix, plan.model)
    try:
        ids, chars = [d for d, _ in plan.docs], [len(t) for t in texts_of(plan.docs)]
        fit = check_job(
            view,
            plan.model,
            plan.options,
            plan.batch_size,
            nc.max_payload,
            ids,
            plan.chunking,
            chars,
            images=images_of(plan.docs),
        )
    except JobRefused as exc:
        raise ConfigError(f"{exc}; nothing was published") from None
    if fit.note:
        print(f"reindex: {fit.note}", flush=True)
    if plan.sink:
        plan = replace(
            plan, shape=shape_for(served(view, plan.model), plan.form, plan.output, plan.chunking is not None)
        )
    if (fit.batch_size, fit.batch_bytes) == (plan.batch_size, plan.batch_bytes):
        return plan
    job = plan._job_id(plan.model, fit.batch_size, fit.batch_bytes)
    return replace(plan, batch_size=fit.batch_size, batch_bytes=fit.batch_bytes, job=job)


async def connect_checked(nats: NatsConfig, plan: Plan):
    """A connection, its JetStream context, the job bucket and the plan, once the fleet can run the
    job and its recorded state allows running it (not another form or input, not cancelled, results
    not expired, not purged a moment ago)."""
    subjects = nats.subjects
    nc = await connect_within(nats, "embedfleet-reindex")
    js = nc.jetstream()
    try:
        plan = await _fitted(nc, subjects.prefix, plan)
        if plan.chunking is not None:
            await check_room(nc, subjects, plan.model, plan.chunking, plan.options)
        kv = await open_streams(js, subjects, plan.retention)
        state = await read_state(kv, plan.job)
        claim = Claim(
            request_digest(plan.model, plan.docs, plan.batch_size, plan.options, plan.chunking, plan.batch_bytes)
        )
        problem = (
            form_conflict(state, plan.form, plan.output)
            or was_cancelled(state)
            or claim_problem(state, claim)
            or await results_gone(js, subjects, plan.job, state)
            or await purged_recently(js, subjects, plan.job, state)
        )
    except BaseException:
        await nc.close()
        raise
    if problem:
        await nc.close()
        raise ConfigError(problem)
    return nc, js, kv, plan


async def results_gone(js, subjects: Subjects, job: str, state: JobState | None) -> str | None:
    """Why a job whose results were stored cannot be collected again (None: it can): the results
    stream holds none of them any more (expired, or pushed out by the stream's size limit)."""
    if state is None or not state.done:
        return None
    subject = subjects.results(job)
    info = await js.stream_info(stream_names(subjects)["results"], subjects_filter=subject)
    if (info.state.subjects or {}).get(subject, 0):
        return None
    return (
        f"job {job} stored {state.done} documents' vectors, and the results stream holds none of them any "
        f"more (expired: --results-max-age, --results-max-bytes); remove the job with `embedfleet jobs purge "
        f"{job}` and run it again, or give another --job-id"
    )


async def purged_recently(js, subjects: Subjects, job: str, state: JobState | None) -> str | None:
    """Why a job purged a moment ago cannot be run again yet (None: it can): the streams would drop
    its batches as repeats of the purged run's."""
    wait = await purge_wait(js, subjects, job) if state is None else 0.0
    if not wait:
        return None
    return (
        f"job {job} was purged less than {DUPLICATE_WINDOW:.0f}s ago, and the streams still take its batches for "
        f"repeats of the purged run's: run it again in {wait:.0f}s, or give another --job-id"
    )
