"""A bulk job's state: what the job bucket holds for it (one JSON object a job, keyed by the job's id),
read into ``JobState`` and written from it.

Its submitter records the job (model, input, documents, form, the request's digest), the stages its
counts and the batches they gave up, the collector and a store's writer their part; each changes it
under compare-and-set (shared/jobs/bucket.py), as a new ``JobState`` made from the one read
(``dataclasses.replace``). Any process that can write the bucket may have written what is read:
``JobState.decode`` refuses what this code does not write (not JSON, a key it does not know, a value of
another type or out of range), naming the job and the key (``JobStateError``).

A field at its default (None, 0, empty) is not written: a job's record holds what happened to it, and
the keys are the fields' names.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import Any

import orjson

from embedfleet.shared.errors import ServiceError, shown
from embedfleet.shared.jobs.progress import Ledger, Span
from embedfleet.shared.sinks.base import Shape
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking
from embedfleet.shared.vectors.forms import FORMS

RUNNING, DONE, DONE_WITH_ERRORS, CANCELLED, STALLED = "running", "done", "done_with_errors", "cancelled", "stalled"
STATUSES = (RUNNING, DONE, DONE_WITH_ERRORS, CANCELLED, STALLED)
FINISHED = (DONE, DONE_WITH_ERRORS, CANCELLED)  # statuses a job keeps once it has one
JOB_OUTPUTS = ("dense", "sparse", "multivector")  # what a bulk job makes (of the protocol's OUTPUTS)
MAX_DEAD_RECORDS = 100  # dead batches (and errors) listed in a job's state; all are counted, and kept in <P>_DEAD
# what a submission records, all at once: a state has all of them or none
SUBMISSION = ("model", "input", "documents", "embedding_type", "output")


class JobStateError(ValueError):
    """A job's record that this code did not write: not JSON, a key it does not know, a value of another
    type. Nothing is made of it (a state written over it would lose what it holds)."""


@dataclass(frozen=True, slots=True)
class Run:
    """Where the current run of a job started (``started``: unix time) and the job's counts then, so
    its rates count this run's work over this run's time."""

    started: float
    done: int
    failed: int
    tokens: int


@dataclass(frozen=True, slots=True)
class Lease:
    """A gateway (``by``) writes the job's rows into its store until ``until`` (unix time), unless renewed."""

    by: str
    until: float


@dataclass(frozen=True, slots=True)
class StoreWait:
    """The job's store refuses its rows since ``since`` (unix time), saying ``message``."""

    message: str
    since: float


@dataclass(frozen=True, slots=True)
class DeadBatch:
    """A batch given up (a dead letter): the ``stage`` that gave it up, its job batch (None: not known)
    and first row, its documents, how many times it was delivered, and why."""

    stage: str
    batch: int | None
    start: int
    documents: int
    deliveries: int
    reason: str


@dataclass(frozen=True, slots=True)
class JobState:
    """One job's state. ``documents`` and the rest of ``SUBMISSION`` are None until a submission
    records the job (a stage may count a batch of a job no one recorded: one published by hand)."""

    job: str
    status: str | None = None  # one of STATUSES; None: no submission yet
    model: str | None = None
    input: str | None = None  # what the documents were read from ("inline", a file)
    documents: int | None = None
    batches: int = 0  # job batches the documents make
    embedding_type: str | None = None  # a vector form's name (shared/vectors/forms.py)
    output: str | None = None  # one of JOB_OUTPUTS
    chunking: JobChunking | None = None  # None: a vector a document
    request: str | None = None  # digest of the request (shared/jobs/requests.py)
    owner: str | None = None  # digest of the API key that made the job
    published: int = 0  # job batches published, from the first
    started: float | None = None  # unix time of the first submission
    run: Run | None = None
    done: int = 0  # documents stored
    failed: int = 0  # documents given up
    tokens: int = 0  # tokens of the documents (chunks) stored
    chunks: int = 0  # a chunked job's chunks, of the job batches cut so far
    chunks_done: int = 0
    chunks_failed: int = 0
    errors: tuple[str, ...] = ()  # the first MAX_DEAD_RECORDS reasons batches were given up for
    dead: tuple[DeadBatch, ...] = ()  # the first MAX_DEAD_RECORDS batches given up
    finished: float | None = None  # unix time
    cancelled: float | None = None  # unix time
    collected: int | None = None  # documents reindex read back and wrote
    dim: int | None = None  # components of a vector, as reindex read them
    # the store the job's rows go to (reindex --sink, POST /v1/jobs "sink"): as shown (no password),
    # the request's URL, the rows' shape, the gateway writing it, the rows written by the current run,
    # a refusal being waited out, when the last row and the index were in, and a refusal for good
    sink: str | None = None
    sink_target: str | None = None
    sink_shape: Shape | None = None
    sink_lease: Lease | None = None
    sink_rows: int = 0
    sink_error: StoreWait | None = None
    sink_done: float | None = None
    sink_failed: str | None = None
    # the bookkeeping that counts each row once (shared/jobs/progress.py, shared/jobs/chunk_progress.py)
    accounted: Ledger = Ledger()
    accounted_chunks: Ledger = Ledger()
    cut: Ledger = Ledger()

    @property
    def submitted(self) -> bool:
        """Whether a submission recorded the job (else its id names no job, whatever was counted)."""
        return self.documents is not None

    def record(self) -> dict[str, Any]:
        """As the bucket holds it: the fields not at their default, as JSON values."""
        record: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            default = f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default
            if f.name == "job" or value != default:
                record[f.name] = _plain(value)
        return record

    def encode(self) -> bytes:
        return orjson.dumps(self.record())

    @classmethod
    def decode(cls, data: bytes | None, job: str) -> JobState:
        """The state the bucket holds under ``job``; JobStateError for anything this code does not write
        (an empty record, which nats-py gives as None, included)."""
        try:
            record = orjson.loads(data or b"")
        except orjson.JSONDecodeError as exc:
            raise JobStateError(f"job {shown(job)}: its state is not JSON ({exc})") from None
        try:
            return cls.from_record(record, job)
        except _Bad as exc:
            raise JobStateError(f"job {shown(job)}: its state is not one this version writes: {exc}") from None

    @classmethod
    def from_record(cls, record: object, job: str) -> JobState:
        """``record`` (as ``record()`` makes it, read from JSON) checked; _Bad names what is wrong."""
        if not isinstance(record, dict):
            raise _Bad(f"a JSON object is expected, not {shown(record)}")
        if record.get("job") != job:
            raise _Bad(f"'job' must be the job's id {job!r}, not {shown(record.get('job'))}")
        if unknown := sorted(k for k in record if k not in _READERS and k != "job"):
            raise _Bad(f"unknown key {shown(unknown[0])}")
        values = {}
        for key, value in record.items():
            if key != "job":
                try:
                    values[key] = _READERS[key](value)
                except _Bad as exc:
                    raise _Bad(f"{key!r}: {exc}") from None
        given = [k for k in SUBMISSION if k in values]
        if given and len(given) < len(SUBMISSION):
            raise _Bad(f"a submission records {', '.join(SUBMISSION)} together, not {', '.join(given)} alone")
        return cls(job, **values)


class _Bad(Exception):
    pass


def _plain(value: Any) -> Any:
    """A field's value as JSON holds it."""
    if isinstance(value, Ledger):
        return {
            "whole": [list(s) for s in value.whole],
            "part": {str(b): [list(s) for s in spans] for b, spans in sorted(value.part.items())},
        }
    if isinstance(value, JobChunking):
        return value.record()
    if isinstance(value, Shape):
        return [value.form, value.output, value.dim, value.chunked]
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, (Run, Lease, StoreWait, DeadBatch)):
        return {f.name: getattr(value, f.name) for f in fields(value)}
    return value


# -- reading: each key's value checked, refused with what it should be ---------------------------------


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise _Bad(f"a string is expected, not {shown(value)}")
    return value


def _count(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _Bad(f"a whole number of at least 0 is expected, not {shown(value)}")
    return value


def _time(value: object) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise _Bad(f"a unix time is expected, not {shown(value)}")
    return float(value)


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise _Bad(f"true or false is expected, not {shown(value)}")
    return value


def _choice(*allowed: str) -> Callable[[object], str]:
    def read(value: object) -> str:
        if value not in allowed:
            raise _Bad(f"one of {', '.join(allowed)} is expected, not {shown(value)}")
        return str(value)

    return read


def _object(value: object, keys: tuple[str, ...]) -> dict:
    if not isinstance(value, dict) or set(value) != set(keys):
        raise _Bad(f"an object of {', '.join(keys)} is expected, not {shown(value)}")
    return value


def _listed(read: Callable[[object], Any], most: int) -> Callable[[object], tuple]:
    def read_all(value: object) -> tuple:
        if not isinstance(value, list) or len(value) > most:
            raise _Bad(f"a list of at most {most} is expected, not {shown(value)}")
        return tuple(read(v) for v in value)

    return read_all


def _spans(value: object) -> tuple[Span, ...]:
    if not isinstance(value, list):
        raise _Bad(f"a list of ranges is expected, not {shown(value)}")
    spans: list[Span] = []
    for span in value:
        if not (isinstance(span, list) and len(span) == 2):
            raise _Bad(f"ranges [lo, hi) are expected, not {shown(span)}")
        lo, hi = _count(span[0]), _count(span[1])
        if lo >= hi or (spans and lo < spans[-1][1]):
            raise _Bad(f"ranges [lo, hi) in order, apart, are expected, not {shown(value)}")
        spans.append((lo, hi))
    return tuple(spans)


def _ledger(value: object) -> Ledger:
    book = _object(value, ("whole", "part"))
    if not isinstance(book["part"], dict):
        raise _Bad(f"'part' must map job batches to ranges, not {shown(book['part'])}")
    part = {}
    for batch, spans in book["part"].items():
        if not (batch.isascii() and batch.isdigit() and len(batch) <= 20):
            raise _Bad(f"'part' must map job batches to ranges, not {shown(batch)}")
        part[int(batch)] = _spans(spans)
    return Ledger(_spans(book["whole"]), part)


def _chunking(value: object) -> JobChunking:
    raw = _object(value, ("size", "overlap", "boundary", "late", "with_text"))
    try:
        return JobChunking(ChunkSpec(raw["size"], raw["overlap"], raw["boundary"]), raw["late"], raw["with_text"])
    except ServiceError as exc:
        raise _Bad(str(exc)) from None


def _shape(value: object) -> Shape:
    if not (isinstance(value, list) and len(value) == 4):
        raise _Bad(f"[form, output, dim, chunked] is expected, not {shown(value)}")
    form, output, dim, chunked = value
    return Shape(_choice(*FORMS)(form), _choice(*JOB_OUTPUTS)(output), _count(dim), _flag(chunked))


def _run(value: object) -> Run:
    raw = _object(value, ("started", "done", "failed", "tokens"))
    return Run(_time(raw["started"]), _count(raw["done"]), _count(raw["failed"]), _count(raw["tokens"]))


def _lease(value: object) -> Lease:
    raw = _object(value, ("by", "until"))
    return Lease(_text(raw["by"]), _time(raw["until"]))


def _store_wait(value: object) -> StoreWait:
    raw = _object(value, ("message", "since"))
    return StoreWait(_text(raw["message"]), _time(raw["since"]))


def _dead(value: object) -> DeadBatch:
    raw = _object(value, ("stage", "batch", "start", "documents", "deliveries", "reason"))
    return DeadBatch(
        _text(raw["stage"]),
        None if raw["batch"] is None else _count(raw["batch"]),
        _count(raw["start"]),
        _count(raw["documents"]),
        _count(raw["deliveries"]),
        _text(raw["reason"]),
    )


_READERS: dict[str, Callable[[object], Any]] = {
    "status": _choice(*STATUSES),
    "model": _text,
    "input": _text,
    "documents": _count,
    "batches": _count,
    "embedding_type": _choice(*FORMS),
    "output": _choice(*JOB_OUTPUTS),
    "chunking": _chunking,
    "request": _text,
    "owner": _text,
    "published": _count,
    "started": _time,
    "run": _run,
    "done": _count,
    "failed": _count,
    "tokens": _count,
    "chunks": _count,
    "chunks_done": _count,
    "chunks_failed": _count,
    "errors": _listed(_text, MAX_DEAD_RECORDS),
    "dead": _listed(_dead, MAX_DEAD_RECORDS),
    "finished": _time,
    "cancelled": _time,
    "collected": _count,
    "dim": _count,
    "sink": _text,
    "sink_target": _text,
    "sink_shape": _shape,
    "sink_lease": _lease,
    "sink_rows": _count,
    "sink_error": _store_wait,
    "sink_done": _time,
    "sink_failed": _text,
    "accounted": _ledger,
    "accounted_chunks": _ledger,
    "cut": _ledger,
}
