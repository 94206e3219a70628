"""GET /v1/jobs/{id}/results: a finished job's vectors, streamed as they are read from the results
stream (shared/job_results.py), never the whole job held: NDJSON (``Accept: application/x-ndjson``,
the default) or Parquet (``application/vnd.apache.parquet`` or ``application/x-parquet``).

NDJSON: one object a document, ``{"id", "vector"}``; the vector as ``embedfleet reindex`` writes it
for the same job: dense a list of numbers (floats for float32 / float16, integers for the quantized
forms), sparse ``{"indices", "values"}``, multivector a list of vectors. Parquet: the columns ``id``
and ``vector`` (a list of the form's type, as reindex's .parquet; sparse a struct of ``indices`` and
``values``; multivector a list of lists), with ``embedding_type``, ``dim`` and ``output`` in the schema's
metadata, a row group every ``ROW_GROUP`` documents.

Rows come in the order they were stored (batches finish in any order), each with its id. A job not
finished yet is a 409 naming its status; an unknown job 404; results expired from the stream 410.
"""

from __future__ import annotations

import io
import logging
from typing import AsyncIterator

import numpy as np
import orjson
from starlette.responses import StreamingResponse

from shared.errors import ErrorCode
from shared.jobs import MAX_JOB_ID, has_state_key, read_state
from shared.job_results import JobForm, ResultsLost, Stored, StoredResults, unfinished
from shared.quantize import FORMS
from services.gateway.errors import ApiError

log = logging.getLogger("embedfleet.gateway.job_results")

NDJSON = "application/x-ndjson"
PARQUET = "application/vnd.apache.parquet"
# media type -> what is answered; the first of these is the default (no Accept, */*, application/*)
_SERVED = {NDJSON: "ndjson", PARQUET: "parquet", "application/x-parquet": "parquet"}
# a Parquet row group ends at this many documents or bytes of vectors (what the response holds before
# sending them: a multivector document can hold a few hundred kB)
ROW_GROUP = 4096
ROW_GROUP_BYTES = 16 << 20


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
    if not offers:
        raise ApiError(ErrorCode.NOT_ACCEPTABLE, f"a job's results are served as {NDJSON} (the default) or {PARQUET} "
                       f"(also application/x-parquet), not {accept!r}", "accept")
    return min(offers)[2]


def ndjson_lines(part: Stored, output: str) -> bytes:
    """``{"id", "vector"}`` a line for each document of ``part``."""
    if output == "sparse":
        vectors = [{"indices": i.astype(np.int64), "values": _numbers(v)} for i, v in part.rows]
    else:
        vectors = [_numbers(v) for v in part.rows]
    return b"".join(orjson.dumps({"id": d, "vector": v}, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
                    for d, v in zip(part.doc_ids, vectors))


def _numbers(values: np.ndarray) -> np.ndarray:
    """What orjson writes as the form's numbers (a little-endian view of the stored bytes is not native)."""
    return values.astype(values.dtype.newbyteorder("="), copy=False)


class ParquetStream:
    """Parquet written into memory a row group at a time, handed out as bytes once written."""

    def __init__(self, form: JobForm) -> None:
        import pyarrow as pa

        self._form = form
        value = pa.from_numpy_dtype(FORMS[form.form][1])
        self._type = {"dense": pa.list_(value), "multivector": pa.list_(pa.list_(value)),
                      "sparse": pa.struct([("indices", pa.list_(pa.int32())), ("values", pa.list_(value))])}[form.output]
        self._sink = io.BytesIO()
        self._writer = None
        self._ids: list[str] = []
        self._vectors: list = []
        self._held = 0  # bytes of the vectors in _vectors

    def add(self, part: Stored) -> bytes:
        if self._writer is None:
            self._open(part.dim)
        self._ids += part.doc_ids
        if self._form.output == "sparse":
            self._vectors += [{"indices": i.astype(np.int32), "values": v} for i, v in part.rows]
            self._held += sum(i.nbytes + v.nbytes for i, v in part.rows)
        else:  # a multivector document's [tokens, width] array as a list of its vectors
            self._vectors += [list(v) if v.ndim == 2 else v for v in part.rows]
            self._held += sum(v.nbytes for v in part.rows)
        return self._flush() if len(self._ids) >= ROW_GROUP or self._held >= ROW_GROUP_BYTES else b""

    def finish(self, dim: int) -> bytes:
        if self._writer is None:
            self._open(dim)
        tail = self._flush()
        self._writer.close()
        return tail + self._taken()

    def _open(self, dim: int) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        meta = {"embedding_type": self._form.form, "dim": str(dim), "output": self._form.output}
        schema = pa.schema([("id", pa.string()), ("vector", self._type)], metadata=meta)
        self._writer = pq.ParquetWriter(self._sink, schema)

    def _flush(self) -> bytes:
        import pyarrow as pa

        if self._ids:
            self._writer.write_table(pa.table({"id": self._ids, "vector": pa.array(self._vectors, self._type)},
                                              schema=self._writer.schema))
            self._ids, self._vectors, self._held = [], [], 0
        return self._taken()

    def _taken(self) -> bytes:
        data = self._sink.getvalue()
        self._sink.seek(0)
        self._sink.truncate()
        return data


class JobResultsApi:
    """The route's logic over the JetStream context, the job bucket and the subjects."""

    def __init__(self, js, kv, subjects) -> None:
        self._js, self._kv, self._subjects = js, kv, subjects

    async def response(self, job: str, accept: str | None) -> StreamingResponse:
        if not has_state_key(job):
            raise ApiError(ErrorCode.NOT_FOUND, f"no job {job[:100]!r}: job ids are at most {MAX_JOB_ID} letters, "
                           "digits and - _ = / .", "id")
        state = await read_state(self._kv, job)
        if state is None or "documents" not in state:
            raise ApiError(ErrorCode.NOT_FOUND, f"no job {job!r}", "id")
        kind = negotiate(accept)
        if (problem := unfinished({"job": job, **state})) is not None:
            raise ApiError(ErrorCode.NOT_FINISHED, problem, "id")
        form = JobForm.of(state)
        reader = StoredResults(self._js, self._subjects, job, form)
        if not await reader.open() and state.get("done"):
            raise ApiError(ErrorCode.GONE, f"job {job} stored {state['done']} documents' vectors, and the results "
                           "stream holds none of them any more (expired: --results-max-age, --results-max-bytes)", "id")
        body = _ndjson(reader, form) if kind == "ndjson" else _parquet(reader, form)
        headers = {"x-job-status": str(state.get("status")), "x-job-documents": str(state.get("documents", 0)),
                   "x-job-done": str(state.get("done", 0)), "x-job-failed": str(state.get("failed", 0)),
                   "x-embedding-type": form.form, "x-job-output": form.output}
        return StreamingResponse(body, media_type=NDJSON if kind == "ndjson" else PARQUET, headers=headers)


async def _ndjson(reader: StoredResults, form: JobForm) -> AsyncIterator[bytes]:
    try:
        async for part in reader:
            yield ndjson_lines(part, form.output)
    except ResultsLost as exc:  # the answer has begun: only ending it short tells the client
        log.error("%s: the answer is cut short", exc)
        raise
    finally:
        await reader.close()


async def _parquet(reader: StoredResults, form: JobForm) -> AsyncIterator[bytes]:
    stream = ParquetStream(form)
    try:
        async for part in reader:
            if data := stream.add(part):
                yield data
        yield stream.finish(reader.dim)
    except ResultsLost as exc:  # a Parquet file cut short has no footer: no reader takes it for whole
        log.error("%s: the answer is cut short", exc)
        raise
    finally:
        await reader.close()
