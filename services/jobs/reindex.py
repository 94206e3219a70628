"""``embedfleet reindex``: a bulk job from the command line (``embedfleet init``:
services/jobs/streams_init.py; ``embedfleet jobs``: services/jobs/admin.py).

reindex reads documents (JSONL ``{"id", "text"}``, Parquet with id/text columns, plain text with
one document a line, or a folder's .txt and .md files, one document a file; for a two-tower model
images instead: ``{"id", "image"}`` lines, an image column, a folder of image files), publishes them as
job batches with JetStream's backpressure (a job of images' batches cut by bytes too; each publish
waits for the stream's acknowledgement), collects the vectors from the results stream through a
durable consumer, and writes them in input order (.npy with a .ids.json beside it, or Parquet; the ids given
up, if any, in a .failed.json beside it: reindex_files.beside), in
the form ``--embedding-type`` names (shared/vectors/forms.py; the worker makes it).
The job id is derived from the input, the model, the form and the chunking, so running the same
command again after it was killed resumes the job: published batches are not sent again, collected
results are read again; the same input in another form is another job. With ``--chunk-size`` the
tokenizers cut every document into chunks and each chunk gets a vector: a row a chunk, with its
place (services/jobs/chunked_output.py says what each format holds).
Everything that can be checked is checked before the first batch is published (services/jobs/plan.py):
the options, the output (its format, its folder made and written to), every document, the job's recorded form.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from embedfleet.services.jobs.chunked_output import write_chunked
from embedfleet.services.jobs.files import FAILED, beside, write_output, write_ragged
from embedfleet.services.jobs.plan import Plan, connect_checked
from embedfleet.services.jobs.sink import open_sink, sink_sources
from embedfleet.shared.jobs.bucket import read_state, update_state
from embedfleet.shared.jobs.collector import Collector, Layout, Polled
from embedfleet.shared.jobs.publish import JobCancelled, JobSink, submit
from embedfleet.shared.jobs.sink_writer import SinkWriter
from embedfleet.shared.jobs.state import CANCELLED, DONE, STALLED, JobState
from embedfleet.shared.jobs.streams import stream_names
from embedfleet.shared.nats.config import NatsConfig
from embedfleet.shared.observability.tracing import Tracer, bind
from embedfleet.shared.sinks import SinkError
from embedfleet.shared.vectors.forms import FORMS

log = logging.getLogger("embedfleet.reindex")


async def reindex(plan: Plan, nats: NatsConfig) -> int:
    """Run ``plan`` (``plan_of`` the command's options): publish, collect, write; the exit status."""
    from tqdm import tqdm

    nc, js, kv, plan = await connect_checked(nats, plan)
    job, docs, subjects = plan.job, plan.docs, nats.subjects
    try:  # the store checked before anything is published: a table of another dimension ends the run here
        sink = None
        if plan.sink:
            assert plan.shape is not None  # connect_checked read it from the fleet
            sink = await open_sink(plan.sink, plan.shape)
    except BaseException:
        await nc.close()
        raise
    layout = Layout.of(docs, plan.batch_size, plan.batch_bytes)
    cut = f", cut into chunks of at most {plan.chunking.spec.size} tokens" if plan.chunking else ""
    kind = "documents (images)" if plan.batch_bytes else "documents"
    print(
        f"job {job}: {len(docs)} {kind} in {len(layout.starts) - 1} batches, model {plan.model}, {plan.output} "
        f"{plan.form} vectors{cut}",
        flush=True,
    )
    # the whole job is one trace: this span, the publishing under it, each batch's stages under that
    tracer = Tracer("reindex", plan.tracing)
    span = tracer.start("reindex", None, "internal", job=job, documents=len(docs))
    bind(span.context, job)
    # opened first: the results stored before it are an earlier run's, not counted in this run's rate
    collector = Collector(
        js,
        job,
        layout,
        subjects.results(job),
        stream_names(subjects)["results"],
        plan.form,
        plan.results_check,
        plan.chunking is not None,
    )
    await collector.open()
    publisher = asyncio.create_task(
        submit(
            js,
            kv,
            subjects,
            job,
            plan.model,
            docs,
            plan.batch_size,
            plan.options,
            str(plan.path),
            tracer,
            chunking=plan.chunking,
            sink=None if sink is None else JobSink(sink.shown),
            submitter="publisher",
            batch_bytes=plan.batch_bytes,
        )
    )
    bar = tqdm(total=len(docs), unit="doc", desc="reindex", disable=plan.quiet)
    writer = (
        None
        if sink is None
        else SinkWriter(
            sink,
            kv,
            job,
            sink_sources(plan.path, docs, plan.with_text, plan.chunking is not None),
            plan.out is not None,
            lambda text: bar.set_postfix_str(text or "", refresh=True),
            lambda line: print(line, flush=True),
        )
    )
    start_time = time.monotonic()
    try:
        stopped, run = await _collect(plan, kv, collector, publisher, bar, plan.stall_timeout, start_time, writer)
        if stopped is not None:
            return stopped
        await publisher
        if writer is not None:
            await writer.flush(collector, final=True)
            await writer.finish()
        return await _write(plan, kv, collector, run, time.monotonic() - start_time, writer)
    except SinkError as exc:  # a refusal waiting cannot cure: what was read stays in the results stream
        assert sink is not None  # the error is its
        print(
            f"job {job}: the store {sink.shown} refused rows: {exc.message}; the job's results stay in the results "
            "stream: run the same command again (with a sink that takes them) to write them",
            flush=True,
        )
        return 1
    finally:
        if sink is not None:
            await asyncio.to_thread(sink.close)
        publisher.cancel()
        await collector.close()
        await nc.drain()
        span.end()
        tracer.shutdown()


def _advance(bar, polled: Polled) -> None:
    """Move the bar by what a poll read; documents an earlier run stored move it without counting
    toward its rate."""
    if bar.disable:
        return
    if polled.earlier:
        bar.n += polled.earlier
        bar.last_print_n += polled.earlier
        bar.initial += polled.earlier
    if polled.now:
        bar.update(polled.now)
    elif polled.earlier:
        bar.refresh()


async def _collect(
    plan: Plan,
    kv,
    collector: Collector,
    publisher: asyncio.Task,
    bar,
    stall_timeout: float,
    start_time: float,
    writer: SinkWriter | None,
):
    """Collect results until every document has its vector or was given up. Returns (1 when the job
    was cancelled or stalled, else None; what this run read)."""
    job, docs = plan.job, plan.docs
    failed, checked = 0, 0.0
    run, last_progress = Polled(), time.monotonic()
    while collector.documents + failed < len(docs):
        polled = await collector.poll()
        if polled.earlier or polled.now or polled.chunks:
            run = run + polled
            _advance(bar, polled)
            last_progress = time.monotonic()
        if writer is not None:  # every document read goes to the store (the wait for it is no stall)
            writer.add(collector.take_fresh(), collector)
            if await writer.flush(collector):
                last_progress = time.monotonic()
        chunks = {"chunks": collector.chunks.chunks} if collector.chunks is not None else {}
        bar.set_postfix(**chunks, tokens_s=f"{run.tokens / max(time.monotonic() - start_time, 1e-6):,.0f}")
        cancelled = publisher.done() and not publisher.cancelled() and isinstance(publisher.exception(), JobCancelled)
        if publisher.done() and not cancelled and (failure := publisher.exception()) is not None:
            raise failure
        if time.monotonic() - checked > 1.0:  # batches given up count as failed in the job's state
            checked = time.monotonic()
            try:
                state = (await read_state(kv, job)) or JobState(job)
                failed = state.failed
                cancelled = cancelled or state.status == CANCELLED
            except Exception:
                pass  # the server is away: next time
        if cancelled:
            bar.close()
            state = (await read_state(kv, job)) or JobState(job)  # its counts, final since the cancel
            chunked = f" ({state.chunks_done} chunks)" if plan.chunking else ""
            print(
                f"job {job}: cancelled, {state.done} of {len(docs)} documents stored{chunked}, "
                f"{state.failed} failed; nothing written to {plan.out or 'a file'} (the stored results stay in the "
                "results stream until the job is purged)"
            )
            return 1, run
        if time.monotonic() - last_progress > stall_timeout:
            errors = list(((await read_state(kv, job)) or JobState(job)).errors)
            await update_state(kv, job, lambda s: replace(s, status=STALLED))
            bar.close()
            print(
                f"job {job}: no progress for {stall_timeout:.0f}s, {collector.documents}/{len(docs)} documents; "
                f"errors: {errors or 'none'}"
            )
            return 1, run
    bar.close()
    return None, run


def _rate(run: Polled, elapsed: float) -> str:
    """This run's work over this run's time (documents an earlier run stored are read, not counted)."""
    earlier = f"; {run.earlier} stored by an earlier run" if run.earlier else ""
    return (
        f"{run.now} embedded in this run, {run.tokens} tokens in {elapsed:.1f}s ({run.now / max(elapsed, 1e-6):,.1f} "
        f"docs/s, {run.tokens / max(elapsed, 1e-6):,.0f} tokens/s){earlier}"
    )


async def _write(plan: Plan, kv, collector: Collector, run: Polled, elapsed: float, writer: SinkWriter | None) -> int:
    """Write the vectors collected, in input order (when there is an output file), and record the job
    done; 1 when some documents were given up (their ids written beside the output, or listed)."""
    job, docs, out, got = plan.job, plan.docs, plan.out, collector.got
    whole: Callable[[str], bool]  # whether a document's vectors are all there
    if collector.chunks is not None:
        whole = collector.chunks.whole
        ids = [d for d, _ in docs if whole(d)]
        said = f"{len(ids)} documents in {collector.chunks.chunks} chunks"
        if out is not None:
            table, rows = collector.chunks.table([d for d, _ in docs])
            vectors = np.stack(rows) if rows else np.zeros((0, 0), FORMS[plan.form].dtype)
            assert plan.chunking is not None  # a chunked job's collector has chunks
            write_chunked(out, table, vectors, plan.form, collector.dim, plan.chunking.record())
            said = f"{len(ids)} documents in {len(table.ids)} chunks"
    else:
        whole = got.__contains__
        ids = [d for d, _ in docs if d in got]
        said = f"{len(ids)} documents"
        if out is not None and plan.output == "dense":
            vectors = np.stack([got[d] for d in ids]) if ids else np.zeros((0, 0), FORMS[plan.form].dtype)
            write_output(out, ids, vectors, plan.form, collector.dim)
        elif out is not None:
            write_ragged(out, ids, [got[d] for d in ids], plan.output, plan.form, collector.dim)
    where = " and ".join(
        ([str(out)] if out is not None else [])
        + ([f"{writer.sink.shown} ({writer.rows} rows)"] if writer is not None else [])
    )
    rate = _rate(run, elapsed)
    if len(ids) < len(docs):
        lost = [d for d, _ in docs if not whole(d)]
        if out is not None:
            failed_path = beside(out, FAILED)
            failed_path.write_text(json.dumps(lost))
            listed = f"ids in {failed_path}"
        else:
            listed = f"ids {', '.join(lost[:10])}{' ...' if len(lost) > 10 else ''}"
        errors = (await update_state(kv, job, lambda s: replace(s, collected=len(ids), dim=collector.dim))).errors
        print(
            f"job {job}: {len(ids)} of {len(docs)} documents ({rate}) -> {where}; {len(lost)} given up "
            f"({listed}; batches in the dead-letter stream): {list(errors[:3])}"
        )
        return 1

    def finish(state: JobState) -> JobState:
        return replace(
            state,
            collected=len(docs),
            dim=collector.dim,
            status=state.status if state.status == CANCELLED else DONE,  # a cancel after the last vector stays said
            finished=state.finished if state.finished is not None else time.time(),
        )

    await update_state(kv, job, finish)
    print(f"job {job}: {said} ({rate}) -> {where}")
    return 0
