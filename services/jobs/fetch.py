"""``embedfleet jobs fetch ID --out FILE``: a finished job's vectors, however it was submitted
(``POST /v1/jobs``, ``embedfleet reindex``, any NATS client), written as ``reindex --out`` writes them:
.npy with .ids.json beside it or .parquet for dense vectors, .npz for sparse and multivector.

The rows are read from the results stream (shared/jobs/results.py) and written in input order: by
batch, then by row within the batch, which is the order of the documents the job was given. Like
reindex, it holds the job's vectors in memory to write them. A chunked job's rows are its chunks, each
once, of the documents whose chunks are all stored (services/jobs/chunked_output.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embedfleet.services.jobs.chunked_output import write_chunked
from embedfleet.services.jobs.files import check_output_path, write_output, write_ragged
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.jobs.bucket import read_state
from embedfleet.shared.jobs.chunks import ChunkedRows
from embedfleet.shared.jobs.ids import job_id_problem
from embedfleet.shared.jobs.results import JobForm, ResultsLost, Stored, StoredResults, expired, unfinished
from embedfleet.shared.jobs.state import CANCELLED, JobState
from embedfleet.shared.jobs.streams import job_bucket
from embedfleet.shared.nats.config import NatsConfig
from embedfleet.shared.nats.lifecycle import connect_within
from embedfleet.shared.vectors.forms import FORMS


async def fetch(nats: NatsConfig, job: str, out: Path) -> int:
    """0 when every document of the job is written; 1 when the job ended with some given up or
    cancelled (what it stored is written); a ConfigError (exit 2) when nothing can be written."""
    if (problem := job_id_problem(job)) is not None:
        raise ConfigError(problem)
    # it reads results as reindex does, under reindex's name: a job publisher's credentials serve
    nc = await connect_within(nats, "embedfleet-reindex")
    try:
        js = nc.jetstream()
        kv = await job_bucket(js, nats.subjects)
        state = await read_state(kv, job) if kv is not None else None
        if state is None or not state.submitted:
            raise ConfigError(f"no job {job!r}")
        if (problem := unfinished(state)) is not None:
            raise ConfigError(f"{problem} (`embedfleet jobs` shows its progress)")
        form = JobForm.of(state)
        check_output_path(out, form.output, form.chunking is not None)
        parts, dim = await _read(StoredResults(js, nats.subjects, job, form), state)
    finally:
        await nc.close()
    if form.chunking is not None:
        return _write_chunks(out, parts, form, dim, state)
    ids = [d for part in parts for d in part.doc_ids]
    if form.output == "dense":
        rows = [part.rows for part in parts]
        vectors = np.concatenate(rows) if rows else np.zeros((0, 0), FORMS[form.form].dtype)
        write_output(out, ids, vectors, form.form, dim)
    else:
        write_ragged(out, ids, [row for part in parts for row in part.rows], form.output, form.form, dim)
    return _said(state, len(ids), out)


async def _read(reader: StoredResults, state: JobState) -> tuple[list[Stored], int]:
    """The job's stored parts in input order, and the rows' dimension."""
    try:
        if not await reader.open() and state.done:
            raise ConfigError(expired(state))
        parts = [part async for part in reader]
    except ResultsLost as exc:
        raise ConfigError(f"{exc}; nothing written") from None
    finally:
        await reader.close()
    return sorted(parts, key=lambda p: (p.batch, p.start)), reader.dim


def _write_chunks(out: Path, parts: list[Stored], form: JobForm, dim: int, state: JobState) -> int:
    """A chunked job's rows written: every chunk once, of the documents whose chunks are all there."""
    assert form.chunking is not None  # a chunked job's alone
    rows = ChunkedRows()
    for part in parts:
        assert part.chunks is not None  # StoredResults checks each result is of the job's kind
        rows.add(part.batch, part.doc_ids, part.rows, part.chunks)
    table, vectors = rows.table()
    write_chunked(
        out,
        table,
        np.stack(vectors) if vectors else np.zeros((0, 0), FORMS[form.form].dtype),
        form.form,
        dim,
        form.chunking.record(),
    )
    return _said(state, rows.complete, out, f" in {len(table.ids)} chunks")


def _said(state: JobState, written: int, out: Path, chunks: str = "") -> int:
    """Print what was written; the exit status (1 when the job's documents are not all there)."""
    documents = state.documents or 0
    line = f"job {state.job}: {written} of {documents} documents{chunks}, {JobForm.of(state).form} vectors -> {out}"
    if written == documents:
        print(line)
        return 0
    missing, failed = documents - written, state.failed
    why = ["it was cancelled"] if state.status == CANCELLED else []
    if failed:
        why.append(f"{failed} were given up (batches in the dead-letter stream)")
    if missing > failed and not why:
        why.append(f"{missing - failed} are no longer in the results stream (expired)")
    print(f"{line}; {missing} missing: {', '.join(why)}")
    return 1
