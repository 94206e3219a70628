"""Wire protocol v1: every message between services, and its msgpack codec.

Messages are msgpack maps with ``v`` (protocol version) and ``t`` (message type). Token IDs and
vectors travel as raw little-endian bytes (``<i4``, ``<f4``, ``<f2``), never as lists of numbers.
Everything read from NATS is untrusted: :func:`decode` checks types, sizes and invariants before
anything is allocated from it, and raises :class:`ProtocolError` otherwise.

Flow of one embedding request split into k chunks::

    gateway --EmbedRequest--> tokenizer --TokenBatch x k--> worker(s) --EmbedResult x >=k--> gateway

The gateway's reply subject travels with the request, so workers answer the gateway directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar, Union

import msgpack
import numpy as np

from shared.errors import ErrorCode

VERSION = 1

# dtype names on the wire -> numpy little-endian dtypes
VECTOR_DTYPES = {"f4": np.dtype("<f4"), "f2": np.dtype("<f2")}
TOKEN_DTYPE = np.dtype("<i4")

MAX_DIMENSION = 65536
MAX_ROWS = 1 << 20


class ProtocolError(ValueError):
    """A message that is not valid protocol v1."""


@dataclass(frozen=True, slots=True)
class EmbedOptions:
    """Per-request output options, carried from the gateway to the worker."""

    normalize: bool | None = None  # None: as the model's modules.json says
    dimensions: int | None = None  # Matryoshka truncation (then renormalised when normalising)
    dtype: str = "f4"  # "f4" | "f2"
    truncate: bool = True  # False: an input over the model limit is an error
    truncation_direction: str = "right"  # "right" keeps the start of an input, "left" its end
    prompt_name: str | None = None  # a prompt of the model that must exist (TEI prompt_name)
    input_type: str | None = None  # "query" / "document": the model's prompt of that name, if any

    def __post_init__(self) -> None:
        if self.truncation_direction not in ("right", "left"):
            raise ProtocolError("options.truncation_direction must be 'right' or 'left'")
        for name in ("prompt_name", "input_type"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or len(value) > 256):
                raise ProtocolError(f"options.{name} must be a short string")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ProtocolError("options.normalize must be a boolean")
        if self.dimensions is not None and (
            not _is_int(self.dimensions) or not 0 < self.dimensions <= MAX_DIMENSION
        ):
            raise ProtocolError("options.dimensions must be a positive integer")
        if self.dtype not in VECTOR_DTYPES:
            raise ProtocolError(f"options.dtype must be one of {sorted(VECTOR_DTYPES)}")
        if not isinstance(self.truncate, bool):
            raise ProtocolError("options.truncate must be a boolean")

    def to_wire(self) -> dict[str, Any]:
        return {
            "n": self.normalize,
            "d": self.dimensions,
            "dt": self.dtype,
            "tr": self.truncate,
            "td": self.truncation_direction,
            "pn": self.prompt_name,
            "it": self.input_type,
        }

    @classmethod
    def from_wire(cls, m: Any) -> EmbedOptions:
        if not isinstance(m, dict):
            raise ProtocolError("options must be a map")
        return cls(
            normalize=m.get("n"),
            dimensions=m.get("d"),
            dtype=m.get("dt", "f4"),
            truncate=m.get("tr", True),
            truncation_direction=m.get("td", "right"),
            prompt_name=m.get("pn"),
            input_type=m.get("it"),
        )


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    """gateway -> tokenizer: texts (or already tokenized inputs) to embed with one model."""

    id: str
    model: str
    texts: list[str]
    deadline: float  # unix time, seconds
    options: EmbedOptions = field(default_factory=EmbedOptions)
    token_ids: list[np.ndarray] | None = None  # inputs given as token IDs ([n] int32 each); texts empty
    pairs: list[tuple[str, str]] | None = None  # (query, document) inputs for cross-encoders; texts empty

    TYPE = "embed"

    @property
    def count(self) -> int:
        if self.token_ids is not None:
            return len(self.token_ids)
        return len(self.pairs) if self.pairs is not None else len(self.texts)


@dataclass(frozen=True, slots=True)
class TokenBatch:
    """tokenizer -> worker: rows [start, start + count) of request ``id``, packed without padding."""

    id: str
    model: str
    start: int
    total: int  # rows in the whole request
    input_ids: np.ndarray  # [T] int32
    cu_seqlens: np.ndarray  # [count + 1] int32, cu_seqlens[0] == 0, cu_seqlens[-1] == T
    deadline: float
    options: EmbedOptions = field(default_factory=EmbedOptions)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage so far
    token_types: np.ndarray | None = None  # [T] int32 segment ids (pairs); None: all 0
    job: str | None = None  # bulk work: the job, whose results go to JetStream, not to a reply subject
    batch: int = 0  # bulk work: the job batch these rows belong to
    doc_ids: list[str] | None = None  # bulk work: the documents of these rows

    TYPE = "tokens"

    @property
    def count(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


@dataclass(frozen=True, slots=True)
class EmbedResult:
    """worker -> gateway: vectors for rows [start, start + count) of request ``id``."""

    id: str
    start: int
    total: int
    dim: int
    dtype: str
    data: bytes  # count * dim little-endian values of dtype
    tokens: int  # real tokens behind these rows (for usage)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage: tokenize, queue, inference

    TYPE = "result"

    @property
    def count(self) -> int:
        return len(self.data) // (self.dim * VECTOR_DTYPES[self.dtype].itemsize)

    def array(self) -> np.ndarray:
        """[count, dim] read-only view of the payload."""
        return np.frombuffer(self.data, dtype=VECTOR_DTYPES[self.dtype]).reshape(-1, self.dim)


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """Any service -> requester: the request (or part of it) failed."""

    id: str
    code: ErrorCode
    message: str

    TYPE = "error"


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    """gateway -> tokenizer: show how texts tokenize (TEI /tokenize)."""

    id: str
    model: str
    texts: list[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None

    TYPE = "tokenize"


@dataclass(frozen=True, slots=True)
class TokenizeResult:
    """tokenizer -> gateway: per text, its tokens as (id, text, special, start, stop)."""

    id: str
    tokens: list[list[tuple[int, str, bool, int | None, int | None]]]

    TYPE = "tokenized"


@dataclass(frozen=True, slots=True)
class JobBatch:
    """client -> tokenizers (JetStream subject <prefix>.v1.jobs.<model>): one batch of a bulk job.

    Wire format, for publishers in any language (a msgpack map):
    ``{"v": 1, "t": "job", "id": JOB_ID, "b": BATCH_INDEX, "m": MODEL, "di": [DOC_ID, ...],
    "x": [TEXT, ...], "o": {"it": "document"|"query"|null, "d": DIMENSIONS|null, "n": NORMALIZE|null,
    "dt": "f4"|"f2", "tr": true}}``, published with header ``Nats-Msg-Id: JOB_ID:BATCH_INDEX``.
    """

    id: str  # the job
    batch: int
    model: str
    doc_ids: list[str]
    texts: list[str]
    options: EmbedOptions = field(default_factory=EmbedOptions)

    TYPE = "job"


@dataclass(frozen=True, slots=True)
class JobResult:
    """worker -> the job's collector (JetStream subject <prefix>.v1.results.<job>): vectors of some documents."""

    id: str  # the job
    batch: int
    start: int  # first row within the batch
    doc_ids: list[str]
    dim: int
    dtype: str
    data: bytes  # len(doc_ids) * dim little-endian values
    tokens: int

    TYPE = "jobresult"

    def array(self) -> np.ndarray:
        return np.frombuffer(self.data, dtype=VECTOR_DTYPES[self.dtype]).reshape(-1, self.dim)


@dataclass(frozen=True, slots=True)
class LoadReport:
    """worker -> tokenizers, every few tens of milliseconds: how much work waits on it."""

    id: str  # the worker's id
    model: str
    subject: str  # where to send it token batches directly
    queued_tokens: int  # tokens waiting or running
    interval: float  # seconds until the next report
    leaving: bool = False  # stopping: send it nothing more
    rate: float = 0.0  # recent tokens/s of its engine (0: not measured yet)

    TYPE = "load"


@dataclass(frozen=True, slots=True)
class RerankRequest:
    """gateway -> scorer: rank ``texts`` by relevance to ``query``."""

    id: str
    model: str
    query: str
    texts: list[str]
    deadline: float
    top_n: int | None = None
    raw_scores: bool = False  # cross-encoders: logits instead of sigmoid scores
    truncate: bool = True  # False: a pair or candidate over the model's limit is an error
    vectors: np.ndarray | None = None  # [n, dim] float32 candidates already embedded (bi-encoders); texts empty
    return_text: bool = False  # the answer carries the ranked candidates' texts

    TYPE = "rerank"

    @property
    def count(self) -> int:
        return len(self.vectors) if self.vectors is not None else len(self.texts)


@dataclass(frozen=True, slots=True)
class RerankResult:
    """scorer -> gateway: candidate indices, best first, with their scores."""

    id: str
    indices: np.ndarray  # [n] int32, into the request's texts
    scores: np.ndarray  # [n] float32, aligned with indices
    texts: list[str] | None = None  # the ranked candidates' texts, when the request asked for them

    TYPE = "ranked"


Message = Union[
    EmbedRequest, TokenBatch, EmbedResult, ErrorReply, TokenizeRequest, TokenizeResult, LoadReport, JobBatch,
    JobResult, RerankRequest, RerankResult,
]


def encode(msg: Message) -> bytes:
    """Serialise one message to msgpack bytes."""
    body: dict[str, Any] = {"v": VERSION, "t": msg.TYPE, "id": msg.id}
    if isinstance(msg, EmbedRequest):
        body |= {"m": msg.model, "x": msg.texts, "dl": msg.deadline, "o": msg.options.to_wire()}
        if msg.token_ids is not None:
            body["tk"] = [np.ascontiguousarray(t, dtype=TOKEN_DTYPE).tobytes() for t in msg.token_ids]
        if msg.pairs is not None:
            body["pr"] = [list(p) for p in msg.pairs]
    elif isinstance(msg, TokenBatch):
        body |= {
            "m": msg.model,
            "s": msg.start,
            "n": msg.total,
            "ids": np.ascontiguousarray(msg.input_ids, dtype=TOKEN_DTYPE).tobytes(),
            "cu": np.ascontiguousarray(msg.cu_seqlens, dtype=TOKEN_DTYPE).tobytes(),
            "dl": msg.deadline,
            "o": msg.options.to_wire(),
            "tm": msg.timings,
        }
        if msg.token_types is not None:
            body["tt"] = np.ascontiguousarray(msg.token_types, dtype=TOKEN_DTYPE).tobytes()
        if msg.job is not None:
            body |= {"jb": msg.job, "bi": msg.batch, "di": msg.doc_ids}
    elif isinstance(msg, EmbedResult):
        body |= {
            "s": msg.start,
            "n": msg.total,
            "dim": msg.dim,
            "dt": msg.dtype,
            "b": msg.data,
            "tok": msg.tokens,
            "tm": msg.timings,
        }
    elif isinstance(msg, ErrorReply):
        body |= {"c": msg.code.value, "e": msg.message}
    elif isinstance(msg, TokenizeRequest):
        body |= {"m": msg.model, "x": msg.texts, "sp": msg.add_special_tokens, "pn": msg.prompt_name}
    elif isinstance(msg, TokenizeResult):
        body |= {"tk": [[list(t) for t in seq] for seq in msg.tokens]}
    elif isinstance(msg, JobBatch):
        body |= {"b": msg.batch, "m": msg.model, "di": msg.doc_ids, "x": msg.texts, "o": msg.options.to_wire()}
    elif isinstance(msg, JobResult):
        body |= {"b": msg.batch, "s": msg.start, "di": msg.doc_ids, "dim": msg.dim, "dt": msg.dtype, "d": msg.data,
                 "tok": msg.tokens}
    elif isinstance(msg, LoadReport):
        body |= {"m": msg.model, "s": msg.subject, "q": msg.queued_tokens, "i": msg.interval, "l": msg.leaving, "r": msg.rate}
    elif isinstance(msg, RerankRequest):
        body |= {"m": msg.model, "q": msg.query, "x": msg.texts, "dl": msg.deadline, "k": msg.top_n,
                 "rs": msg.raw_scores, "tr": msg.truncate, "rt": msg.return_text}
        if msg.vectors is not None:
            body |= {"cv": np.ascontiguousarray(msg.vectors, dtype=VECTOR_DTYPES["f4"]).tobytes(), "cd": msg.vectors.shape[1]}
    elif isinstance(msg, RerankResult):
        body |= {
            "i": np.ascontiguousarray(msg.indices, dtype=TOKEN_DTYPE).tobytes(),
            "sc": np.ascontiguousarray(msg.scores, dtype=VECTOR_DTYPES["f4"]).tobytes(),
        }
        if msg.texts is not None:
            body["x"] = msg.texts
    else:  # pragma: no cover - internal misuse
        raise TypeError(f"not a protocol message: {type(msg).__name__}")
    return msgpack.packb(body, use_bin_type=True)


def decode(data: bytes) -> Message:
    """Parse and validate one message; raises ProtocolError on anything malformed."""
    try:
        m = msgpack.unpackb(data, raw=False, strict_map_key=True, max_map_len=64)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"not a msgpack message: {exc}") from None
    if not isinstance(m, dict):
        raise ProtocolError("message must be a msgpack map")
    if m.get("v") != VERSION:
        raise ProtocolError(f"unsupported protocol version {m.get('v')!r} (this is v{VERSION})")
    kind = m.get("t")
    decoder = _DECODERS.get(kind)  # type: ignore[arg-type]
    if decoder is None:
        raise ProtocolError(f"unknown message type {kind!r}")
    return decoder(m)


M = TypeVar(
    "M", EmbedRequest, TokenBatch, EmbedResult, ErrorReply, TokenizeRequest, TokenizeResult, LoadReport, JobBatch,
    JobResult, RerankRequest, RerankResult,
)


def decode_as(data: bytes, kind: type[M]) -> M:
    """Decode a message that must be of type ``kind``; ProtocolError otherwise."""
    msg = decode(data)
    if not isinstance(msg, kind):
        raise ProtocolError(f"expected a {kind.TYPE!r} message, got {msg.TYPE!r}")
    return msg


def _decode_embed(m: dict) -> EmbedRequest:
    texts = _str_list(m, "x")
    token_ids = None
    if m.get("tk") is not None:
        raw = _req(m, "tk", list)
        if texts or not all(isinstance(t, bytes) for t in raw):
            raise ProtocolError("token inputs must be byte strings, with no texts beside them")
        token_ids = [_int32_array(t, "token input") for t in raw]
    pairs = None
    if m.get("pr") is not None:
        raw = _req(m, "pr", list)
        if texts or token_ids is not None:
            raise ProtocolError("pair inputs come alone, with no texts or token inputs beside them")
        if not all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in raw):
            raise ProtocolError("pairs must be [query, document] string pairs")
        pairs = [(p[0], p[1]) for p in raw]
    return EmbedRequest(
        id=_req(m, "id", str),
        model=_req(m, "m", str),
        texts=texts,
        deadline=_req_number(m, "dl"),
        options=EmbedOptions.from_wire(m.get("o", {})),
        token_ids=token_ids,
        pairs=pairs,
    )


def _decode_tokenize(m: dict) -> TokenizeRequest:
    special, prompt = m.get("sp", True), m.get("pn")
    if not isinstance(special, bool) or (prompt is not None and not isinstance(prompt, str)):
        raise ProtocolError("add_special_tokens must be a boolean and prompt_name a string")
    return TokenizeRequest(
        id=_req(m, "id", str), model=_req(m, "m", str), texts=_str_list(m, "x"), add_special_tokens=special,
        prompt_name=prompt,
    )


def _decode_tokenized(m: dict) -> TokenizeResult:
    tokens = []
    for seq in _req(m, "tk", list):
        if not isinstance(seq, list):
            raise ProtocolError("tokens must be lists")
        row = []
        for t in seq:
            if not (isinstance(t, list) and len(t) == 5 and _is_int(t[0]) and isinstance(t[1], str) and isinstance(t[2], bool)):
                raise ProtocolError("a token is [id, text, special, start, stop]")
            if not all(x is None or _is_int(x) for x in t[3:]):
                raise ProtocolError("token offsets must be integers or null")
            row.append(tuple(t))
        tokens.append(row)
    return TokenizeResult(id=_req(m, "id", str), tokens=tokens)


def _str_list(m: dict, key: str) -> list[str]:
    values = _req(m, key, list)
    if not all(isinstance(t, str) for t in values):
        raise ProtocolError("texts must be strings")
    return values


def _timings(m: dict) -> dict[str, float]:
    raw = m.get("tm") or {}
    if not isinstance(raw, dict) or len(raw) > 8:
        raise ProtocolError("timings must be a small map")
    out = {}
    for k, v in raw.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ProtocolError("timings map stage names to seconds")
        out[k] = float(v)
    return out


def _decode_tokens(m: dict) -> TokenBatch:
    ids = _int32_array(_req(m, "ids", bytes), "ids")
    cu = _int32_array(_req(m, "cu", bytes), "cu")
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != len(ids) or np.any(np.diff(cu) <= 0):
        raise ProtocolError("cu_seqlens must start at 0, increase strictly and end at len(ids)")
    start, total = _req_int(m, "s"), _req_int(m, "n")
    if not (0 <= start and start + len(cu) - 1 <= total <= MAX_ROWS):
        raise ProtocolError("rows out of range")
    token_types = None
    if m.get("tt") is not None:
        token_types = _int32_array(_req(m, "tt", bytes), "token types")
        if len(token_types) != len(ids) or (len(ids) and token_types.min() < 0):
            raise ProtocolError("token types must be one non-negative value per token")
    job = m.get("jb")
    doc_ids = None
    if job is not None:
        if not isinstance(job, str):
            raise ProtocolError("job must be a string")
        doc_ids = _str_list(m, "di")
        if len(doc_ids) != len(cu) - 1:
            raise ProtocolError("one document id per row")
    return TokenBatch(
        id=_req(m, "id", str),
        model=_req(m, "m", str),
        start=start,
        total=total,
        input_ids=ids,
        cu_seqlens=cu,
        deadline=_req_number(m, "dl"),
        options=EmbedOptions.from_wire(m.get("o", {})),
        timings=_timings(m),
        token_types=token_types,
        job=job,
        batch=_req_int(m, "bi") if job is not None else 0,
        doc_ids=doc_ids,
    )


def _decode_result(m: dict) -> EmbedResult:
    dim, dtype, data = _req_int(m, "dim"), _req(m, "dt", str), _req(m, "b", bytes)
    if dtype not in VECTOR_DTYPES:
        raise ProtocolError(f"unknown vector dtype {dtype!r}")
    if not 0 < dim <= MAX_DIMENSION:
        raise ProtocolError("dimension out of range")
    row_bytes = dim * VECTOR_DTYPES[dtype].itemsize
    if len(data) == 0 or len(data) % row_bytes:
        raise ProtocolError("payload is not a whole number of rows")
    start, total = _req_int(m, "s"), _req_int(m, "n")
    if not (0 <= start and start + len(data) // row_bytes <= total <= MAX_ROWS):
        raise ProtocolError("rows out of range")
    return EmbedResult(
        id=_req(m, "id", str),
        start=start,
        total=total,
        dim=dim,
        dtype=dtype,
        data=data,
        tokens=_req_int(m, "tok"),
        timings=_timings(m),
    )


def _decode_error(m: dict) -> ErrorReply:
    try:
        code = ErrorCode(_req(m, "c", str))
    except ValueError:
        code = ErrorCode.INTERNAL
    return ErrorReply(id=_req(m, "id", str), code=code, message=_req(m, "e", str))


def _decode_job(m: dict) -> JobBatch:
    doc_ids, texts = _str_list(m, "di"), _str_list(m, "x")
    if len(doc_ids) != len(texts) or not texts:
        raise ProtocolError("a job batch needs as many document ids as texts, and at least one")
    return JobBatch(
        id=_req(m, "id", str), batch=_req_int(m, "b"), model=_req(m, "m", str), doc_ids=doc_ids, texts=texts,
        options=EmbedOptions.from_wire(m.get("o", {})),
    )


def _decode_job_result(m: dict) -> JobResult:
    dim, dtype, data = _req_int(m, "dim"), _req(m, "dt", str), _req(m, "d", bytes)
    doc_ids = _str_list(m, "di")
    if dtype not in VECTOR_DTYPES or not 0 < dim <= MAX_DIMENSION:
        raise ProtocolError("bad vector dtype or dimension")
    if len(data) != len(doc_ids) * dim * VECTOR_DTYPES[dtype].itemsize:
        raise ProtocolError("payload does not hold one vector per document")
    return JobResult(
        id=_req(m, "id", str), batch=_req_int(m, "b"), start=_req_int(m, "s"), doc_ids=doc_ids, dim=dim,
        dtype=dtype, data=data, tokens=_req_int(m, "tok"),
    )


def _decode_load(m: dict) -> LoadReport:
    interval, leaving, rate = _req_number(m, "i"), m.get("l", False), float(m.get("r") or 0.0)
    if not 0 < interval <= 60 or not isinstance(leaving, bool) or not 0 <= rate < 1e12:
        raise ProtocolError("load report: interval in (0, 60] seconds, a boolean leaving, a rate >= 0")
    return LoadReport(
        id=_req(m, "id", str), model=_req(m, "m", str), subject=_req(m, "s", str),
        queued_tokens=_req_int(m, "q"), interval=interval, leaving=leaving, rate=rate,
    )


def _decode_rerank(m: dict) -> RerankRequest:
    texts = _str_list(m, "x")
    top_n = m.get("k")
    if top_n is not None and (not _is_int(top_n) or top_n <= 0):
        raise ProtocolError("top_n must be a positive integer")
    vectors = None
    if m.get("cv") is not None:
        data, dim = _req(m, "cv", bytes), _req_int(m, "cd")
        if not 0 < dim <= MAX_DIMENSION or len(data) % (4 * dim):
            raise ProtocolError("candidate vectors must be n * dim little-endian float32 values, 0 < dim <= "
                                f"{MAX_DIMENSION}")
        if texts:
            raise ProtocolError("give candidates as texts or as vectors, not both")
        vectors = np.frombuffer(data, dtype=VECTOR_DTYPES["f4"]).reshape(-1, dim)
    return RerankRequest(
        id=_req(m, "id", str),
        model=_req(m, "m", str),
        query=_req(m, "q", str),
        texts=texts,
        deadline=_req_number(m, "dl"),
        top_n=top_n,
        raw_scores=_opt_bool(m, "rs", False),
        truncate=_opt_bool(m, "tr", True),
        vectors=vectors,
        return_text=_opt_bool(m, "rt", False),
    )


def _decode_ranked(m: dict) -> RerankResult:
    indices = _int32_array(_req(m, "i", bytes), "indices")
    scores_buf = _req(m, "sc", bytes)
    if len(scores_buf) != 4 * len(indices):
        raise ProtocolError("scores and indices differ in length")
    texts = _str_list(m, "x") if m.get("x") is not None else None
    if texts is not None and len(texts) != len(indices):
        raise ProtocolError("texts and indices differ in length")
    return RerankResult(
        id=_req(m, "id", str), indices=indices, scores=np.frombuffer(scores_buf, dtype=VECTOR_DTYPES["f4"]), texts=texts,
    )


_DECODERS = {
    EmbedRequest.TYPE: _decode_embed,
    TokenBatch.TYPE: _decode_tokens,
    EmbedResult.TYPE: _decode_result,
    ErrorReply.TYPE: _decode_error,
    TokenizeRequest.TYPE: _decode_tokenize,
    TokenizeResult.TYPE: _decode_tokenized,
    LoadReport.TYPE: _decode_load,
    JobBatch.TYPE: _decode_job,
    JobResult.TYPE: _decode_job_result,
    RerankRequest.TYPE: _decode_rerank,
    RerankResult.TYPE: _decode_ranked,
}


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _req(m: dict, key: str, typ: type) -> Any:
    value = m.get(key)
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ProtocolError(f"field {key!r} must be {typ.__name__}")
    return value


def _req_int(m: dict, key: str) -> int:
    value = _req(m, key, int)
    if value < 0:
        raise ProtocolError(f"field {key!r} must not be negative")
    return value


def _req_number(m: dict, key: str) -> float:
    value = m.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"field {key!r} must be a number")
    return float(value)


def _int32_array(buf: bytes, name: str) -> np.ndarray:
    if len(buf) % TOKEN_DTYPE.itemsize:
        raise ProtocolError(f"{name} is not a whole number of int32 values")
    return np.frombuffer(buf, dtype=TOKEN_DTYPE)


def _opt_bool(m: dict, key: str, default: bool) -> bool:
    value = m.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ProtocolError(f"field {key!r} must be true or false")
    return value
