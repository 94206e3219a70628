"""Protocol v1 codec: msgpack encoding, and decoding that checks every field before use."""

from __future__ import annotations

from typing import Any, TypeVar, Union

import msgpack
import numpy as np

from shared.errors import ErrorCode
from shared.protocol.checks import (
    MAX_ID, MAX_PROMPT_TOKENS, MAX_ROWS, TOKEN_DTYPE, ProtocolError, _id, _int32_array, _is_int, _name, _opt_bool, _opt_number, _req,
    _req_int, _req_number, _show, _str_list, _timings,
)
from shared.protocol.messages import (
    MAX_DIMENSION, SPARSE_DTYPES, VECTOR_DTYPES, VERSION, row_bytes, DecodeRequest, DecodeResult, EmbedOptions, EmbedRequest,
    EmbedResult, ErrorReply, JobBatch, JobResult, LoadReport, RerankRequest, RerankResult, TokenBatch, TokenizeRequest,
    TokenizeResult,
)


Message = Union[
    EmbedRequest, TokenBatch, EmbedResult, ErrorReply, TokenizeRequest, TokenizeResult, DecodeRequest, DecodeResult,
    LoadReport, JobBatch, JobResult, RerankRequest, RerankResult,
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
        if msg.prompt_tokens:
            body["pt"] = msg.prompt_tokens
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
        } | _ragged_wire(msg.offsets, msg.indices)
    elif isinstance(msg, ErrorReply):
        body |= {"c": msg.code.value, "e": msg.message}
        if msg.row is not None:
            body["row"] = msg.row
    elif isinstance(msg, TokenizeRequest):
        body |= {"m": msg.model, "x": msg.texts, "sp": msg.add_special_tokens, "pn": msg.prompt_name}
    elif isinstance(msg, TokenizeResult):
        body |= {"tk": [[list(t) for t in seq] for seq in msg.tokens]}
    elif isinstance(msg, DecodeRequest):
        body |= {"m": msg.model, "tk": [np.ascontiguousarray(t, dtype=TOKEN_DTYPE).tobytes() for t in msg.ids],
                 "ss": msg.skip_special_tokens}
    elif isinstance(msg, DecodeResult):
        body |= {"x": msg.texts}
    elif isinstance(msg, JobBatch):
        body |= {"b": msg.batch, "m": msg.model, "di": msg.doc_ids, "x": msg.texts, "o": msg.options.to_wire()}
    elif isinstance(msg, JobResult):
        body |= {"b": msg.batch, "s": msg.start, "di": msg.doc_ids, "dim": msg.dim, "dt": msg.dtype, "d": msg.data,
                 "tok": msg.tokens} | _ragged_wire(msg.offsets, msg.indices)
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


def _ragged_wire(offsets: np.ndarray | None, indices: np.ndarray | None) -> dict[str, bytes]:
    wire = {}
    if offsets is not None:
        wire["of"] = np.ascontiguousarray(offsets, dtype=TOKEN_DTYPE).tobytes()
    if indices is not None:
        wire["ix"] = np.ascontiguousarray(indices, dtype=TOKEN_DTYPE).tobytes()
    return wire


def _payload_layout(m: dict, data: bytes, dtype: str, dim: int, empty: bool = False) -> tuple[int, np.ndarray | None, np.ndarray | None]:
    """Check a result payload against its dtype, dimension and optional offsets / indices (all before any
    array is made from them); returns (inputs it holds, offsets, indices)."""
    if dtype not in VECTOR_DTYPES:
        raise ProtocolError(f"unknown vector dtype {_show(dtype)}")
    if not 0 < dim <= MAX_DIMENSION:
        raise ProtocolError("dimension out of range")
    offsets = indices = None
    if m.get("ix") is not None:  # sparse: values with their vocabulary indices
        if dtype not in SPARSE_DTYPES or m.get("of") is None:
            raise ProtocolError(f"sparse results hold {' or '.join(SPARSE_DTYPES)} values and per-input offsets")
        indices = _int32_array(_req(m, "ix", bytes), "indices")
        if len(data) != len(indices) * VECTOR_DTYPES[dtype].itemsize:
            raise ProtocolError("sparse results need one value per index")
        if len(indices) and (indices.min() < 0 or indices.max() >= dim):
            raise ProtocolError(f"sparse indices must be in [0, {dim})")
        entries = len(indices)
    else:
        size = row_bytes(dtype, dim)
        if len(data) % size or (not data and not empty and m.get("of") is None):
            raise ProtocolError("payload is not a whole number of rows")
        entries = len(data) // size
    if m.get("of") is None:
        return entries, None, None
    offsets = _int32_array(_req(m, "of", bytes), "offsets")
    # differences in int64: int32 offsets could wrap around and pass as non-decreasing
    if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != entries or np.any(np.diff(offsets.astype(np.int64)) < 0):
        raise ProtocolError("offsets must start at 0, never decrease and end at the payload's entries")
    return len(offsets) - 1, offsets, indices


def decode(data: bytes) -> Message:
    """Parse and validate one message; raises ProtocolError on anything malformed."""
    try:
        # no length msgpack reads may exceed the message's own size, so a claimed length allocates
        # nothing the bytes do not back; nesting is bounded by msgpack's fixed parser stack
        limit = len(data)
        m = msgpack.unpackb(data, raw=False, strict_map_key=True, max_map_len=64, max_str_len=limit,
                            max_bin_len=limit, max_array_len=limit, max_ext_len=limit)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"not a msgpack message: {str(exc)[:200]}") from None
    if not isinstance(m, dict):
        raise ProtocolError("message must be a msgpack map")
    version = m.get("v")
    if not _is_int(version) or version != VERSION:
        raise ProtocolError(f"unsupported protocol version {_show(version)} (this is v{VERSION})")
    kind = m.get("t")
    decoder = _DECODERS.get(kind) if isinstance(kind, str) else None
    if decoder is None:
        raise ProtocolError(f"unknown message type {_show(kind)}")
    return decoder(m)


M = TypeVar(
    "M", EmbedRequest, TokenBatch, EmbedResult, ErrorReply, TokenizeRequest, TokenizeResult, DecodeRequest, DecodeResult,
    LoadReport, JobBatch, JobResult, RerankRequest, RerankResult,
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
        if texts or len(raw) > MAX_ROWS or not all(isinstance(t, bytes) for t in raw):
            raise ProtocolError("token inputs must be byte strings, with no texts beside them")
        token_ids = [_int32_array(t, "token input") for t in raw]
    pairs = None
    if m.get("pr") is not None:
        raw = _req(m, "pr", list)
        if texts or token_ids is not None or len(raw) > MAX_ROWS:
            raise ProtocolError("pair inputs come alone, with no texts or token inputs beside them")
        if not all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in raw):
            raise ProtocolError("pairs must be [query, document] string pairs")
        pairs = [(p[0], p[1]) for p in raw]
    return EmbedRequest(
        id=_id(m),
        model=_name(m, "m"),
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
        id=_id(m), model=_name(m, "m"), texts=_str_list(m, "x"), add_special_tokens=special,
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
    return TokenizeResult(id=_id(m), tokens=tokens)


def _decode_decode(m: dict) -> DecodeRequest:
    raw = _req(m, "tk", list)
    if len(raw) > MAX_ROWS or not all(isinstance(t, bytes) for t in raw):
        raise ProtocolError(f"ids must be at most {MAX_ROWS} byte strings of int32 token IDs")
    return DecodeRequest(
        id=_id(m), model=_name(m, "m"), ids=[_int32_array(t, "ids") for t in raw],
        skip_special_tokens=_opt_bool(m, "ss", True),
    )


def _decode_decoded(m: dict) -> DecodeResult:
    return DecodeResult(id=_id(m), texts=_str_list(m, "x"))


def _decode_tokens(m: dict) -> TokenBatch:
    ids = _int32_array(_req(m, "ids", bytes), "ids")
    cu = _int32_array(_req(m, "cu", bytes), "cu")
    # differences taken in int64: int32 offsets could wrap around and pass as increasing
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != len(ids) or np.any(np.diff(cu.astype(np.int64)) <= 0):
        raise ProtocolError("cu_seqlens must start at 0, increase strictly and end at len(ids)")
    start, total = _req_int(m, "s"), _req_int(m, "n")
    if not (0 <= start and start + len(cu) - 1 <= total <= MAX_ROWS):
        raise ProtocolError("rows out of range")
    token_types = None
    if m.get("tt") is not None:
        token_types = _int32_array(_req(m, "tt", bytes), "token types")
        if len(token_types) != len(ids) or (len(ids) and token_types.min() < 0):
            raise ProtocolError("token types must be one non-negative value per token")
    prompt_tokens = _req_int(m, "pt") if m.get("pt") is not None else 0
    if not 0 <= prompt_tokens <= MAX_PROMPT_TOKENS:
        raise ProtocolError(f"prompt_tokens must be between 0 and {MAX_PROMPT_TOKENS}")
    job = _name(m, "jb") if m.get("jb") is not None else None
    doc_ids = None
    if job is not None:
        doc_ids = _str_list(m, "di")
        if len(doc_ids) != len(cu) - 1:
            raise ProtocolError("one document id per row")
    return TokenBatch(
        id=_id(m),
        model=_name(m, "m"),
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
        prompt_tokens=prompt_tokens,
    )


def _decode_result(m: dict) -> EmbedResult:
    dim, dtype, data = _req_int(m, "dim"), _req(m, "dt", str), _req(m, "b", bytes)
    count, offsets, indices = _payload_layout(m, data, dtype, dim)
    start, total = _req_int(m, "s"), _req_int(m, "n")
    if not (0 <= start and start + count <= total <= MAX_ROWS):
        raise ProtocolError("rows out of range")
    return EmbedResult(
        id=_id(m),
        start=start,
        total=total,
        dim=dim,
        dtype=dtype,
        data=data,
        tokens=_req_int(m, "tok"),
        timings=_timings(m),
        offsets=offsets,
        indices=indices,
    )


def _decode_error(m: dict) -> ErrorReply:
    try:
        code = ErrorCode(_req(m, "c", str))
    except ValueError:
        code = ErrorCode.INTERNAL
    return ErrorReply(id=_id(m), code=code, message=_req(m, "e", str), row=_req_int(m, "row") if "row" in m else None)


def _decode_job(m: dict) -> JobBatch:
    doc_ids, texts = _str_list(m, "di"), _str_list(m, "x")
    if len(doc_ids) != len(texts) or not texts:
        raise ProtocolError("a job batch needs as many document ids as texts, and at least one")
    return JobBatch(
        id=_name(m, "id"), batch=_req_int(m, "b"), model=_name(m, "m"), doc_ids=doc_ids, texts=texts,
        options=EmbedOptions.from_wire(m.get("o", {})),
    )


def _decode_job_result(m: dict) -> JobResult:
    dim, dtype, data = _req_int(m, "dim"), _req(m, "dt", str), _req(m, "d", bytes)
    doc_ids = _str_list(m, "di")
    count, offsets, indices = _payload_layout(m, data, dtype, dim, empty=True)
    if count != len(doc_ids):
        raise ProtocolError("payload does not hold one vector per document")
    return JobResult(
        id=_name(m, "id"), batch=_req_int(m, "b"), start=_req_int(m, "s"), doc_ids=doc_ids, dim=dim,
        dtype=dtype, data=data, tokens=_req_int(m, "tok"), offsets=offsets, indices=indices,
    )


def _decode_load(m: dict) -> LoadReport:
    interval, leaving, rate = _req_number(m, "i"), m.get("l", False), _opt_number(m, "r", 0.0)
    if not 0 < interval <= 60 or not isinstance(leaving, bool) or not 0 <= rate < 1e12:
        raise ProtocolError("load report: interval in (0, 60] seconds, a boolean leaving, a rate >= 0")
    return LoadReport(
        id=_name(m, "id"), model=_name(m, "m"), subject=_name(m, "s", MAX_ID),
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
        if len(vectors) > MAX_ROWS or not np.isfinite(vectors).all():
            raise ProtocolError(f"candidate vectors: at most {MAX_ROWS}, of finite values")
    return RerankRequest(
        id=_id(m),
        model=_name(m, "m"),
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
        id=_id(m), indices=indices, scores=np.frombuffer(scores_buf, dtype=VECTOR_DTYPES["f4"]), texts=texts,
    )


_DECODERS = {
    EmbedRequest.TYPE: _decode_embed,
    TokenBatch.TYPE: _decode_tokens,
    EmbedResult.TYPE: _decode_result,
    ErrorReply.TYPE: _decode_error,
    TokenizeRequest.TYPE: _decode_tokenize,
    TokenizeResult.TYPE: _decode_tokenized,
    DecodeRequest.TYPE: _decode_decode,
    DecodeResult.TYPE: _decode_decoded,
    LoadReport.TYPE: _decode_load,
    JobBatch.TYPE: _decode_job,
    JobResult.TYPE: _decode_job_result,
    RerankRequest.TYPE: _decode_rerank,
    RerankResult.TYPE: _decode_ranked,
}
