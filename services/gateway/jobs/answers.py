"""What the bulk-job routes answer, as typed models: POST /v1/jobs (a job submitted, or the state of one
submitted before), GET /v1/jobs (a page of jobs), GET and DELETE /v1/jobs/{job} (a job's state) and a
line of GET /v1/jobs/{job}/results' NDJSON. /openapi.json's response schemas are made from them, and the tests
hold what the routes write to them; the routes write with orjson (api.py, results.py).

A job's state is its record in the job bucket (shared/jobs/state.py) as api.py's ``_shown`` shows
it: a field at its default (None, 0, empty) is left out, so every field but ``id`` may be absent.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from embedfleet.services.gateway.response_parts import ANSWER, omitted

# shared/jobs/state.py's STATUSES, shared/vectors/forms.py's FORMS, shared/jobs/state.py's JOB_OUTPUTS and
# shared/text_chunks.py's BOUNDARIES (the tests hold them equal)
Status = Literal["running", "done", "done_with_errors", "cancelled", "stalled"]
Form = Literal["float32", "float16", "int8", "uint8", "binary", "ubinary"]
Output = Literal["dense", "sparse", "multivector"]
Boundary = Literal["token", "sentence"]


class JobChunking(BaseModel):
    """How a chunked job cuts its documents (its ``chunking`` and ``with_text`` fields, as recorded)."""

    model_config = ANSWER

    size: int = Field(description="content tokens a chunk at most")
    overlap: int = Field(description="tokens consecutive chunks share at most")
    boundary: Boundary = Field(description="where chunks are cut: between words, or at sentence ends")
    late: bool = Field(description="late chunking: each chunk pooled from the token states of the text around it")
    with_text: bool = Field(description="each chunk's text is stored beside its vector")


class JobSubmitted(BaseModel):
    """POST /v1/jobs' answer to a new job (202)."""

    model_config = ANSWER

    id: str = Field(description="the job's id: GET /v1/jobs/{id} its state, GET /v1/jobs/{id}/results its vectors")
    status: Status = Field(description="'running' as a rule (a file's documents are published in the background)")
    documents: int = Field(description="the documents submitted")
    model: str = Field(description="the served model that embeds them")
    embedding_type: Form = Field(description="the vectors' form")
    batch_size: int = Field(description="documents a job batch, as the job runs")
    note: str = omitted("why the batch size is smaller than asked (it would not fit a NATS message)")
    chunking: JobChunking = omitted("a chunked job's chunking")
    sink: str = omitted("the store the gateway writes the rows into (its URL without password)")


class JobRun(BaseModel):
    """Where the job's current run started, and its counts then (its rates count this run's work)."""

    model_config = ANSWER

    started: float = Field(description="unix time, seconds")
    done: int
    failed: int
    tokens: int


class JobDeadBatch(BaseModel):
    """A batch given up (a dead letter)."""

    model_config = ANSWER

    stage: str = Field(description="the stage that gave it up: tokenizer, worker, ...")
    batch: int | None = Field(description="its job batch (null: not known)")
    start: int = Field(description="its first row")
    documents: int
    deliveries: int = Field(description="how many times it was delivered")
    reason: str


class JobStoreWait(BaseModel):
    """The job's store refuses its rows for now (down, busy, out of room): the writing waits."""

    model_config = ANSWER

    message: str = Field(description="what the store says")
    since: float = Field(description="unix time, seconds")


class JobStatus(BaseModel):
    """A job's state: GET /v1/jobs/{job}, DELETE /v1/jobs/{job} (after it), and POST /v1/jobs (200) for
    the same request again. A field at its default (0, empty, none) is left out."""

    model_config = ANSWER

    id: str = Field(description="the job's id")
    status: Status = omitted()
    model: str = omitted()
    input: str = omitted("what the documents were read from: 'inline', or the file")
    documents: int = omitted("documents submitted")
    batches: int = omitted("job batches the documents make")
    embedding_type: Form = omitted("the vectors' form")
    output: Output = omitted("what a document's vector is")
    chunking: JobChunking = omitted("a chunked job's chunking (none: a vector a document)")
    request: str = omitted("digest of the request (the same request again resumes the job)")
    published: int = omitted("job batches published, from the first")
    started: float = omitted("unix time of the first submission, seconds")
    run: JobRun = omitted()
    done: int = omitted("documents stored")
    failed: int = omitted("documents given up")
    tokens: int = omitted("tokens of the documents (chunks) stored")
    chunks: int = omitted("a chunked job's chunks, of the job batches cut so far")
    chunks_done: int = omitted("chunks stored")
    chunks_failed: int = omitted("chunks given up")
    errors: list[str] = omitted("the first 100 reasons batches were given up for")
    dead: list[JobDeadBatch] = omitted("the first 100 batches given up")
    finished: float = omitted("unix time, seconds")
    cancelled: float = omitted("unix time, seconds")
    collected: int = omitted("documents embedfleet reindex read back and wrote")
    dim: int = omitted("components of a vector, as reindex read them")
    sink: str = omitted("the store the rows go to (its URL without password)")
    sink_target: str = omitted("the store as the request named it")
    sink_shape: tuple[Form, Output, int, bool] = omitted(
        "the store's rows: [form, output, dim (components; a sparse output's vocabulary), chunked]"
    )
    sink_rows: int = omitted("rows the current writer wrote into the store")
    sink_error: JobStoreWait = omitted()
    sink_done: float = omitted("unix time the last row and the index were in the store, seconds")
    sink_failed: str = omitted("why the store refused the rows for good (the job stays unfinished)")


class JobList(BaseModel):
    """GET /v1/jobs' answer: a page of the jobs the caller may see, newest first (OpenAI's list shape)."""

    model_config = ANSWER

    object: Literal["list"]
    data: list[JobStatus] = Field(description="each job as GET /v1/jobs/{job} answers it, newest first")
    first_id: str | None = Field(description="the first job's id (null: an empty page)")
    last_id: str | None = Field(description="the last job's id: the next page's 'after' (null: an empty page)")
    has_more: bool = Field(description="whether jobs follow this page")


# -- GET /v1/jobs/{job}/results: a line of its NDJSON ---------------------------------------------------

# a vector's numbers: floats for float32 / float16, integers for the quantized forms
_Numbers = list[float]


class JobSparseVector(BaseModel):
    """A sparse vector: its nonzero components."""

    model_config = ANSWER

    indices: list[int] = Field(description="the components' indices (in the model's vocabulary)")
    values: _Numbers = Field(description="their values")


JobVector = (
    Annotated[_Numbers, Field(description="dense: d numbers of the job's form")]
    | JobSparseVector
    | Annotated[list[_Numbers], Field(description="multivector: a vector per token")]
)


class JobResultLine(BaseModel):
    """One line of a job's results: a document's vector, or a chunked job's: a chunk's, with its place
    (and, when stored, its text); in the order the results were stored."""

    model_config = ANSWER

    id: str = Field(description="the document's id")
    chunk: int = omitted("a chunked job's: the chunk's number within its document, from 0")
    start: int = omitted("a chunked job's: the chunk's first character in the document")
    end: int = omitted("a chunked job's: past its last character (text[start:end] is the chunk)")
    text: str = omitted("a chunked job's that stores texts (with_text): the chunk's text")
    vector: JobVector = Field(description="as the job's output makes it (header x-job-output)")
