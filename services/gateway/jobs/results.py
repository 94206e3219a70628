"""GET /v1/jobs/{id}/results: a finished job's vectors, streamed as they are read from the results
stream (shared/jobs/results.py), never the whole job held: NDJSON (``Accept: application/x-ndjson``,
the default) or Parquet (``application/vnd.apache.parquet`` or ``application/x-parquet``).

NDJSON: one object a document, ``{"id", "vector"}``; the vector as ``embedfleet reindex`` writes it
for the same job: dense a list of numbers (floats for float32 / float16, integers for the quantized
forms), sparse ``{"indices", "values"}``, multivector a list of vectors. A chunked job's: one object a
chunk, ``{"id", "chunk", "start", "end", "vector"}`` (and ``"text"`` when the job stores texts).
Parquet: the columns reindex writes (services/gateway/jobs/parquet.py).

Rows come in the order they were stored (batches finish in any order), each with its id. A job not
finished yet is a 409 naming its status; an unknown job 404; results expired from the stream 410.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import numpy as np
import orjson
from starlette.responses import StreamingResponse

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.jobs.owners import JobOwners
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.extras import installed
from embedfleet.shared.jobs.bucket import read_state
from embedfleet.shared.jobs.chunks import stored_columns
from embedfleet.shared.jobs.results import JobForm, ResultsLost, Stored, StoredResults, expired, unfinished

log = logging.getLogger("embedfleet.gateway.job_results")

NDJSON = "application/x-ndjson"
PARQUET = "application/vnd.apache.parquet"
# media type -> what is answered; the first of these is the default (no Accept, */*, application/*)
_SERVED = {NDJSON: "ndjson", PARQUET: "parquet", "application/x-parquet": "parquet"}


def negotiate(accept: str | None) -> str:
    """'ndjson' or 'parquet' from an Accept header, by its q-values (ties: the order given); a 406
    when it names neither nor a wildcard."""
    offers: list[tuple[float, int, str]] = []
    for order, part in enumerate((accept or "*/*").lower().split(",")):
        media, *params = (p.strip() for p in part.split(";"))
        q = next((p[2:] for p in params if p.startswith("q=")), "1")
        try:
            weight = float(q)
        except ValueError:
            weight = 0.0
        kind = "ndjson" if media in ("*/*", "application/*", "") else _SERVED.get(media)
        if kind is not None and weight > 0:
            offers.append((-weight, order, kind))
    if any(kind == "parquet" for *_, kind in offers) and not installed("pyarrow"):
        offers = [offer for offer in offers if offer[2] != "parquet"]  # another form asked for may still be served
        if not offers:
            raise ApiError(
                ErrorCode.NOT_ACCEPTABLE,
                f"this gateway serves a job's results as {NDJSON} only: {PARQUET} needs pyarrow, which the "
                "extra 'jobs' installs (pip install 'embedfleet[jobs]'; the gateway's image has it)",
                "accept",
            )
    if not offers:
        raise ApiError(
            ErrorCode.NOT_ACCEPTABLE,
            f"a job's results are served as {NDJSON} (the default) or {PARQUET} "
            f"(also application/x-parquet), not {accept!r}",
            "accept",
        )
    return min(offers)[2]


def ndjson_lines(part: Stored, output: str) -> bytes:
    """``{"id", "vector"}`` a line for each document of ``part``; a chunked job's, ``{"id", "chunk",
    "start", "end", "vector"[, "text"]}`` a line for each chunk."""
    vectors: list[dict[str, np.ndarray]] | list[np.ndarray]
    if output == "sparse":
        vectors = [{"indices": i.astype(np.int64), "values": _numbers(v)} for i, v in part.rows]
    else:
        vectors = [_numbers(v) for v in part.rows]
    if part.chunks is None:
        lines = ({"id": d, "vector": v} for d, v in zip(part.doc_ids, vectors))
    else:
        columns = stored_columns(part.doc_ids, part.chunks).columns()
        lines = ({**dict(zip(columns, values)), "vector": v} for *values, v in zip(*columns.values(), vectors))
    return b"".join(orjson.dumps(line, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n" for line in lines)


def _numbers(values: np.ndarray) -> np.ndarray:
    """What orjson writes as the form's numbers (a little-endian view of the stored bytes is not native)."""
    return values.astype(values.dtype.newbyteorder("="), copy=False)


class JobResultsApi:
    """The route's logic over the JetStream context, the job bucket and the subjects."""

    def __init__(self, js, kv, subjects, owners: JobOwners | None = None) -> None:
        self._js, self._kv, self._subjects = js, kv, subjects
        self._owners = owners or JobOwners(False, ())

    async def response(self, job: str, accept: str | None) -> StreamingResponse:
        state = await read_state(self._kv, job)
        if state is None or not state.submitted or not self._owners.sees(state):  # another key's: as none
            raise ApiError(ErrorCode.NOT_FOUND, f"no job {job!r}", "id")
        kind = negotiate(accept)
        if (problem := unfinished(state)) is not None:
            raise ApiError(ErrorCode.NOT_FINISHED, problem, "id")
        form = JobForm.of(state)
        reader = StoredResults(self._js, self._subjects, job, form)
        try:
            if not await reader.open() and state.done:
                raise ApiError(ErrorCode.GONE, expired(state), "id")
        except BaseException:  # refused, or the client gone before the body began: _closing will not run
            await asyncio.shield(reader.close())
            raise
        body = _closing(reader, _ndjson(reader, form) if kind == "ndjson" else _parquet(reader, form))
        headers = {
            "x-job-status": str(state.status),
            "x-job-documents": str(state.documents),
            "x-job-done": str(state.done),
            "x-job-failed": str(state.failed),
            "x-embedding-type": form.form,
            "x-job-output": form.output,
        }
        if form.chunking is not None:  # its lines are chunks: as many as it stored
            headers["x-job-chunks"] = str(state.chunks_done)
        return StreamingResponse(body, media_type=NDJSON if kind == "ndjson" else PARQUET, headers=headers)


async def _closing(reader: StoredResults, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``chunks`` as the body of an answer: results lost while read cut it short (a Parquet file cut
    short has no footer, an NDJSON body no end: no client takes either for whole), and the reader is
    closed whatever ends it."""
    try:
        async for chunk in chunks:
            yield chunk
    except ResultsLost as exc:  # the answer has begun: only ending it short tells the client
        log.error("%s: the answer is cut short", exc)
        raise
    finally:  # also when the client went away (the task cancelled): the close runs to its end
        await asyncio.shield(reader.close())


async def _ndjson(reader: StoredResults, form: JobForm) -> AsyncIterator[bytes]:
    async for part in reader:
        yield ndjson_lines(part, form.output)


async def _parquet(reader: StoredResults, form: JobForm) -> AsyncIterator[bytes]:
    from embedfleet.services.gateway.jobs.parquet import ParquetStream  # pyarrow: loaded by the first Parquet answer

    stream = ParquetStream(form)
    async for part in reader:
        if data := stream.add(part):
            yield data
    yield stream.finish(reader.dim)
