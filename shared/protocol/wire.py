"""Each message's wire form: one encoder and one decoder per message, in the order of docs/protocol.md,
whose tables list the keys (shared/protocol/codec.py frames them, with the version and the type)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from embedfleet.shared.errors import GATEWAY_ONLY, ErrorCode, ServiceError, shown
from embedfleet.shared.protocol.checks import (
    MAX_AVOID,
    MAX_BUNDLE,
    MAX_ID,
    MAX_IMAGE_SIDE,
    MAX_IMAGE_TOKENS,
    MAX_NAME,
    MAX_PATCH_BYTES,
    MAX_PROMPT_TOKENS,
    MAX_ROWS,
    TOKEN_DTYPE,
    ProtocolError,
    cancel_key,
    checked_id,
    checked_name,
    image_files,
    int32_array,
    is_int,
    name_tuple,
    optional_bool,
    optional_cancel_key,
    optional_number,
    required,
    required_int,
    required_number,
    str_list,
    timings_field,
)
from embedfleet.shared.protocol.chunk_rows import ChunkRows
from embedfleet.shared.protocol.messages import (
    MAX_DIMENSION,
    SPARSE_DTYPES,
    Cancel,
    ChunkLayout,
    ChunkRequest,
    DecodeRequest,
    DecodeResult,
    EmbedOptions,
    EmbedRequest,
    EmbedResult,
    ErrorReply,
    Held,
    JobBatch,
    JobResult,
    LoadReport,
    Replies,
    Requests,
    RerankRequest,
    RerankResult,
    TokenChunk,
    TokenizeRequest,
    TokenizeResult,
    row_bytes,
)
from embedfleet.shared.protocol.spans import CONTENT_KEYS, SEQUENCE_KEYS, spans_body, spans_field
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking
from embedfleet.shared.vectors.forms import FLOAT32, WIRE_FORMS


def _tokens_wire(ids: np.ndarray) -> bytes:
    """Token IDs, offsets or indices on the wire: little-endian int32 bytes."""
    return np.ascontiguousarray(ids, dtype=TOKEN_DTYPE).tobytes()


def _ragged_wire(offsets: np.ndarray | None, indices: np.ndarray | None) -> dict[str, bytes]:
    wire = {}
    if offsets is not None:
        wire["of"] = _tokens_wire(offsets)
    if indices is not None:
        wire["ix"] = _tokens_wire(indices)
    return wire


def _payload_layout(
    m: dict, data: bytes, dtype: str, dim: int, empty: bool = False
) -> tuple[int, np.ndarray | None, np.ndarray | None]:
    """Check a result payload against its dtype, dimension and optional offsets / indices (all before any
    array is made from them); returns (inputs it holds, offsets, indices)."""
    if dtype not in WIRE_FORMS:
        raise ProtocolError(f"unknown vector dtype {shown(dtype)}")
    if not 0 < dim <= MAX_DIMENSION:
        raise ProtocolError("dimension out of range")
    offsets = indices = None
    if m.get("ix") is not None:  # sparse: values with their vocabulary indices
        if dtype not in SPARSE_DTYPES or m.get("of") is None:
            raise ProtocolError(f"sparse results hold {' or '.join(SPARSE_DTYPES)} values and per-input offsets")
        indices = int32_array(required(m, "ix", bytes), "indices")
        if len(data) != len(indices) * WIRE_FORMS[dtype].dtype.itemsize:
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
    offsets = int32_array(required(m, "of", bytes), "offsets")
    # differences in int64: int32 offsets could wrap around and pass as non-decreasing
    if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != entries or np.any(np.diff(offsets.astype(np.int64)) < 0):
        raise ProtocolError("offsets must start at 0, never decrease and end at the payload's entries")
    return len(offsets) - 1, offsets, indices


def _encode_embed_request(msg: EmbedRequest) -> dict[str, Any]:
    body = {"id": msg.id, "m": msg.model, "x": msg.texts, "dl": msg.deadline, "o": msg.options.to_wire()}
    if msg.token_ids is not None:
        body["tk"] = [_tokens_wire(t) for t in msg.token_ids]
    if msg.pairs is not None:
        body["pr"] = [list(p) for p in msg.pairs]
    if msg.held:
        body["hd"] = True
    if msg.replies:
        body["rb"] = True
    if msg.cancel_key is not None:
        body["cx"] = msg.cancel_key
    if msg.images is not None:
        body["im"] = msg.images
    if msg.avoid:
        body["av"] = list(msg.avoid)
    return body | spans_body(msg.spans, CONTENT_KEYS)


def _decode_embed_request(m: dict) -> EmbedRequest:
    texts = str_list(m, "x")
    token_ids = None
    if m.get("tk") is not None:
        raw = required(m, "tk", list)
        if texts or len(raw) > MAX_ROWS or not all(isinstance(t, bytes) for t in raw):
            raise ProtocolError("token inputs must be byte strings, with no texts beside them")
        token_ids = [int32_array(t, "token input") for t in raw]
    pairs = None
    if m.get("pr") is not None:
        raw = required(m, "pr", list)
        if texts or token_ids is not None or len(raw) > MAX_ROWS:
            raise ProtocolError("pair inputs come alone, with no texts or token inputs beside them")
        if not all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in raw):
            raise ProtocolError("pairs must be [query, document] string pairs")
        pairs = [(p[0], p[1]) for p in raw]
    images = None
    if m.get("im") is not None:
        if texts or token_ids is not None or pairs is not None:
            raise ProtocolError("image inputs come alone, with no texts, token or pair inputs beside them")
        images = image_files(m)
    options = EmbedOptions.from_wire(m.get("o", {}))
    spans = spans_field(m, CONTENT_KEYS, options.output, None)
    if spans is not None and (
        token_ids is not None or pairs is not None or images is not None or spans.rows != len(texts)
    ):
        raise ProtocolError("spans come with texts, one row of spans per text")
    return EmbedRequest(
        id=checked_id(m),
        model=checked_name(m, "m"),
        texts=texts,
        deadline=required_number(m, "dl"),
        options=options,
        token_ids=token_ids,
        pairs=pairs,
        held=optional_bool(m, "hd", False),
        replies=optional_bool(m, "rb", False),
        spans=spans,
        cancel_key=optional_cancel_key(m),
        images=images,
        avoid=name_tuple(m, "av", MAX_AVOID),
    )


def _encode_token_chunk(msg: TokenChunk) -> dict[str, Any]:
    body = {
        "id": msg.id,
        "m": msg.model,
        "s": msg.start,
        "rows": msg.total,
        "ids": _tokens_wire(msg.input_ids),
        "cu": _tokens_wire(msg.cu_seqlens),
        "dl": msg.deadline,
        "o": msg.options.to_wire(),
        "tm": msg.timings,
    }
    if msg.token_types is not None:
        body["tt"] = _tokens_wire(msg.token_types)
    if msg.prompt_tokens:
        body["pt"] = msg.prompt_tokens
    if msg.held:
        body["hd"] = True
    if msg.replies:
        body["rb"] = True
    if msg.cancel_key is not None:
        body["cx"] = msg.cancel_key
    if msg.job is not None:
        body |= {"jb": msg.job, "bi": msg.batch, "di": msg.doc_ids}
    if msg.chunks is not None:
        body |= msg.chunks.to_wire()
    if msg.pixels is not None:
        body |= {"px": np.ascontiguousarray(msg.pixels, dtype=np.uint8).tobytes(), "pxs": list(msg.pixels.shape)}
    if msg.pages is not None and msg.page_grids is not None:
        body |= {
            "pg": np.ascontiguousarray(msg.pages, dtype=np.uint8).tobytes(),
            "pgw": int(msg.pages.shape[1]),
            "pgg": _tokens_wire(msg.page_grids.reshape(-1)),
        }
    return body | spans_body(msg.spans, SEQUENCE_KEYS)


def _decode_token_chunk(m: dict) -> TokenChunk:
    ids = int32_array(required(m, "ids", bytes), "ids")
    cu = int32_array(required(m, "cu", bytes), "cu")
    pixels = _pixels_field(m, len(cu) - 1, ids)
    pages, page_grids = _pages_field(m, len(cu) - 1, pixels is not None)
    # image rows at their own size (SigLIP 2 NaFlex): patch rows and a grid each, no token ids, each row
    # counted as its patches
    patch_images = page_grids is not None and not len(ids)
    # differences taken in int64: int32 offsets could wrap around and pass as increasing
    end = len(ids) if pixels is None and not patch_images else int(cu[-1]) if len(cu) else -1
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != end or np.any(np.diff(cu.astype(np.int64)) <= 0):
        raise ProtocolError("cu_seqlens must start at 0, increase strictly and end at len(ids)")
    if pixels is not None and np.any(np.diff(cu.astype(np.int64)) > MAX_IMAGE_TOKENS):
        raise ProtocolError(f"an image row counts at most {MAX_IMAGE_TOKENS} tokens")
    if (
        patch_images
        and page_grids is not None
        and not np.array_equal(np.diff(cu.astype(np.int64)), page_grids[:, 0].astype(np.int64) * page_grids[:, 1])
    ):
        raise ProtocolError("an image row of patches counts its grid's patches")
    start, total = required_int(m, "s"), required_int(m, "rows")
    if not (start >= 0 and start + len(cu) - 1 <= total <= MAX_ROWS):
        raise ProtocolError("rows out of range")
    token_types = None
    if m.get("tt") is not None:
        token_types = int32_array(required(m, "tt", bytes), "token types")
        if len(token_types) != len(ids) or (len(ids) and token_types.min() < 0):
            raise ProtocolError("token types must be one non-negative value per token")
    prompt_tokens = required_int(m, "pt") if m.get("pt") is not None else 0
    if not 0 <= prompt_tokens <= MAX_PROMPT_TOKENS:
        raise ProtocolError(f"prompt_tokens must be between 0 and {MAX_PROMPT_TOKENS}")
    job = checked_name(m, "jb") if m.get("jb") is not None else None
    options = EmbedOptions.from_wire(m.get("o", {}))
    spans = spans_field(m, SEQUENCE_KEYS, options.output, np.diff(cu))
    doc_ids = chunks = None
    if job is not None:
        doc_ids = str_list(m, "di")
        # a bulk batch's result rows: its rows, or with spans its spans (a late-chunked job's chunks)
        rows = len(cu) - 1 if spans is None else len(spans.firsts)
        if len(doc_ids) != rows or start + rows > total:
            raise ProtocolError("one document id per row (per span, with spans), the rows within the total")
        chunks = ChunkRows.from_wire(m, rows, start, total)
        if spans is not None and chunks is None:
            raise ProtocolError("a bulk batch's spans are a late-chunked job's chunks: it names them")
    return TokenChunk(
        id=checked_id(m),
        model=checked_name(m, "m"),
        start=start,
        total=total,
        input_ids=ids,
        cu_seqlens=cu,
        deadline=required_number(m, "dl"),
        options=options,
        timings=timings_field(m),
        token_types=token_types,
        job=job,
        batch=required_int(m, "bi") if job is not None else 0,
        doc_ids=doc_ids,
        prompt_tokens=prompt_tokens,
        held=optional_bool(m, "hd", False),
        replies=optional_bool(m, "rb", False),
        spans=spans,
        chunks=chunks,
        cancel_key=optional_cancel_key(m),
        pixels=pixels,
        pages=pages,
        page_grids=page_grids,
    )


def _pixels_field(m: dict, rows: int, ids: np.ndarray) -> np.ndarray | None:
    """An image chunk's pixels [rows, C, H, W] uint8, checked against its shape before any copy; None
    for token rows."""
    if m.get("px") is None:
        return None
    data, shape = required(m, "px", bytes), required(m, "pxs", list)
    if len(shape) != 4 or not all(is_int(v) for v in shape):
        raise ProtocolError("pxs must be the pixels' shape [images, channels, height, width]")
    n, c, h, w = shape
    if n != rows or c not in (1, 3) or not (0 < h <= MAX_IMAGE_SIDE and 0 < w <= MAX_IMAGE_SIDE):
        raise ProtocolError(
            f"pixels must be one [1 or 3, <= {MAX_IMAGE_SIDE}, <= {MAX_IMAGE_SIDE}] image per row of the chunk"
        )
    if len(data) != n * c * h * w or len(ids):
        raise ProtocolError("pixels must hold exactly their shape's bytes, with no token ids beside them")
    return np.frombuffer(data, dtype=np.uint8).reshape(n, c, h, w)


def _pages_field(m: dict, rows: int, pixels: bool) -> tuple[np.ndarray | None, np.ndarray | None]:
    """A page chunk's patch rows [P, width] uint8 and grids [rows, 2] int32 (one image per row), checked
    against each other before any copy; (None, None) for other rows."""
    if m.get("pg") is None:
        return None, None
    data, width = required(m, "pg", bytes), required_int(m, "pgw")
    grids = int32_array(required(m, "pgg", bytes), "pgg").astype(np.int64)
    if pixels or not 0 < width <= MAX_PATCH_BYTES or len(grids) != 2 * rows:
        raise ProtocolError(
            f"pages must be patch rows of 1 to {MAX_PATCH_BYTES} bytes with one (height, width) grid per row, "
            "and no pixels beside them"
        )
    grids = grids.reshape(rows, 2)
    if grids.min(initial=1) < 1 or grids.max(initial=1) > MAX_IMAGE_SIDE:
        raise ProtocolError(f"a page's grid must be 1 to {MAX_IMAGE_SIDE} patches each way")
    if len(data) != int((grids[:, 0] * grids[:, 1]).sum()) * width:
        raise ProtocolError("pages must hold exactly their grids' patch rows")
    return np.frombuffer(data, dtype=np.uint8).reshape(-1, width), grids.astype(np.int32)


def _encode_embed_result(msg: EmbedResult) -> dict[str, Any]:
    return {
        "id": msg.id,
        "s": msg.start,
        "rows": msg.total,
        "dim": msg.dim,
        "dt": msg.dtype,
        "vec": msg.data,
        "tok": msg.tokens,
        "tm": msg.timings,
    } | _ragged_wire(msg.offsets, msg.indices)


def _decode_embed_result(m: dict) -> EmbedResult:
    dim, dtype, data = required_int(m, "dim"), required(m, "dt", str), required(m, "vec", bytes)
    count, offsets, indices = _payload_layout(m, data, dtype, dim)
    start, total = required_int(m, "s"), required_int(m, "rows")
    if not (start >= 0 and start + count <= total <= MAX_ROWS):
        raise ProtocolError("rows out of range")
    return EmbedResult(
        id=checked_id(m),
        start=start,
        total=total,
        dim=dim,
        dtype=dtype,
        data=data,
        tokens=required_int(m, "tok"),
        timings=timings_field(m),
        offsets=offsets,
        indices=indices,
    )


def _encode_error_reply(msg: ErrorReply) -> dict[str, Any]:
    body: dict[str, Any] = {"id": msg.id, "c": msg.code.value, "e": msg.message}
    if msg.row is not None:
        body["row"] = msg.row
    return body


def _decode_error_reply(m: dict) -> ErrorReply:
    try:
        code = ErrorCode(required(m, "c", str))
    except ValueError:
        code = ErrorCode.INTERNAL
    if code in GATEWAY_ONLY:
        code = ErrorCode.INTERNAL
    row = required_int(m, "row") if "row" in m else None  # the encoder leaves it out when there is none
    return ErrorReply(id=checked_id(m), code=code, message=required(m, "e", str), row=row)


def _encode_requests(msg: Requests) -> dict[str, Any]:
    return {"rp": msg.subjects, "tp": msg.traces, "ms": msg.messages}


def _decode_requests(m: dict) -> Requests:
    subjects, traces, messages = str_list(m, "rp"), str_list(m, "tp"), required(m, "ms", list)
    if not 0 < len(subjects) <= MAX_BUNDLE or not len(subjects) == len(traces) == len(messages):
        raise ProtocolError(f"requests need 1 to {MAX_BUNDLE} messages, each with its reply subject and trace")
    if not all(isinstance(x, bytes) for x in messages) or any(len(t) > MAX_NAME for t in traces):
        raise ProtocolError(f"requests' messages are bytes, their traces strings of at most {MAX_NAME} characters")
    inbox = subjects[0].rpartition(".")[0]
    if not inbox or any(not 0 < len(x) <= MAX_NAME or x.rpartition(".")[0] != inbox for x in subjects):
        raise ProtocolError("requests' reply subjects must share one inbox (all but their last token)")
    return Requests(subjects, traces, messages)


def _encode_held(msg: Held) -> dict[str, Any]:
    return {"id": msg.id, "s": msg.start, "hn": msg.rows, "wk": msg.holder}


def _decode_held(m: dict) -> Held:
    start, rows = required_int(m, "s"), required_int(m, "hn")
    if rows < 1 or start + rows > MAX_ROWS:
        raise ProtocolError(f"held rows {start}..{start + rows} are not within a request of at most {MAX_ROWS}")
    return Held(id=checked_id(m), start=start, rows=rows, holder=checked_name(m, "wk"))


def _encode_replies(msg: Replies) -> dict[str, Any]:
    return {"rp": msg.subjects, "ms": msg.messages}


def _decode_replies(m: dict) -> Replies:
    subjects, messages = str_list(m, "rp"), required(m, "ms", list)
    if len(messages) != len(subjects) or not all(isinstance(x, bytes) for x in messages):
        raise ProtocolError("replies need one message (bytes) per reply subject")
    if any(not 0 < len(x) <= MAX_NAME for x in subjects):
        raise ProtocolError(f"a reply subject must have 1 to {MAX_NAME} characters")
    return Replies(subjects, messages)


def _encode_cancel(msg: Cancel) -> dict[str, Any]:
    return {"id": msg.id, "cx": msg.key, "dl": msg.deadline}


def _decode_cancel(m: dict) -> Cancel:
    return Cancel(id=checked_id(m), key=cancel_key(m), deadline=required_number(m, "dl"))


def _encode_tokenize_request(msg: TokenizeRequest) -> dict[str, Any]:
    return {"id": msg.id, "m": msg.model, "x": msg.texts, "sp": msg.add_special_tokens, "pn": msg.prompt_name}


def _decode_tokenize_request(m: dict) -> TokenizeRequest:
    special, prompt = m.get("sp", True), m.get("pn")
    if not isinstance(special, bool) or (prompt is not None and not isinstance(prompt, str)):
        raise ProtocolError("add_special_tokens must be a boolean and prompt_name a string")
    return TokenizeRequest(
        id=checked_id(m),
        model=checked_name(m, "m"),
        texts=str_list(m, "x"),
        add_special_tokens=special,
        prompt_name=prompt,
    )


def _encode_tokenize_result(msg: TokenizeResult) -> dict[str, Any]:
    return {"id": msg.id, "tkd": [[list(t) for t in seq] for seq in msg.tokens]}


def _decode_tokenize_result(m: dict) -> TokenizeResult:
    tokens = []
    for seq in required(m, "tkd", list):
        if not isinstance(seq, list):
            raise ProtocolError("tokens must be lists")
        row = []
        for t in seq:
            if not (
                isinstance(t, list)
                and len(t) == 5
                and is_int(t[0])
                and isinstance(t[1], str)
                and isinstance(t[2], bool)
            ):
                raise ProtocolError("a token is [id, text, special, start, stop]")
            if not all(x is None or is_int(x) for x in t[3:]):
                raise ProtocolError("token offsets must be integers or null")
            row.append(tuple(t))
        tokens.append(row)
    return TokenizeResult(id=checked_id(m), tokens=tokens)


def _encode_decode_request(msg: DecodeRequest) -> dict[str, Any]:
    return {"id": msg.id, "m": msg.model, "tk": [_tokens_wire(t) for t in msg.ids], "ss": msg.skip_special_tokens}


def _decode_decode_request(m: dict) -> DecodeRequest:
    raw = required(m, "tk", list)
    if len(raw) > MAX_ROWS or not all(isinstance(t, bytes) for t in raw):
        raise ProtocolError(f"ids must be at most {MAX_ROWS} byte strings of int32 token IDs")
    return DecodeRequest(
        id=checked_id(m),
        model=checked_name(m, "m"),
        ids=[int32_array(t, "ids") for t in raw],
        skip_special_tokens=optional_bool(m, "ss", True),
    )


def _encode_decode_result(msg: DecodeResult) -> dict[str, Any]:
    return {"id": msg.id, "x": msg.texts}


def _decode_decode_result(m: dict) -> DecodeResult:
    return DecodeResult(id=checked_id(m), texts=str_list(m, "x"))


def _encode_chunk_request(msg: ChunkRequest) -> dict[str, Any]:
    spec = msg.spec
    return {
        "id": msg.id,
        "m": msg.model,
        "x": msg.texts,
        "sz": spec.size,
        "ov": spec.overlap,
        "bd": spec.boundary,
        "pn": msg.prompt_name,
        "it": msg.input_type,
    } | ({} if msg.task is None else {"tk": msg.task})


def _decode_chunk_request(m: dict) -> ChunkRequest:
    size: Any = m.get("sz")  # None or any wire value: ChunkSpec checks it
    try:
        spec = ChunkSpec(size, m.get("ov", 0), m.get("bd", "token"))  # checked as a client's request is
    except ServiceError as exc:
        raise ProtocolError(exc.message) from None
    prompt = EmbedOptions(prompt_name=m.get("pn"), input_type=m.get("it"), task=m.get("tk"))  # as an embed request's
    return ChunkRequest(
        id=checked_id(m),
        model=checked_name(m, "m"),
        texts=str_list(m, "x"),
        spec=spec,
        prompt_name=prompt.prompt_name,
        input_type=prompt.input_type,
        task=prompt.task,
    )


# ChunkLayout's arrays: key -> field
_LAYOUT_INPUTS = {"cc": "counts", "ct": "tokens"}
_LAYOUT_CHUNKS = {"cs": "starts", "ce": "ends", "cf": "firsts", "cl": "lasts"}


def _encode_chunk_layout(msg: ChunkLayout) -> dict[str, Any]:
    arrays = _LAYOUT_INPUTS | _LAYOUT_CHUNKS
    body = {"id": msg.id} | {key: _tokens_wire(getattr(msg, name)) for key, name in arrays.items()}
    return body | ({"rm": msg.room} if msg.room else {})


def _decode_chunk_layout(m: dict) -> ChunkLayout:
    inputs = {name: int32_array(required(m, key, bytes), name) for key, name in _LAYOUT_INPUTS.items()}
    chunks = {name: int32_array(required(m, key, bytes), name) for key, name in _LAYOUT_CHUNKS.items()}
    counts, tokens = inputs["counts"], inputs["tokens"]
    # lengths first: every array below is at most MAX_ROWS long before anything is computed from it
    if len(counts) != len(tokens) or len(counts) > MAX_ROWS:
        raise ProtocolError(f"a layout has one chunk count and one token count per input, at most {MAX_ROWS} inputs")
    n = len(chunks["starts"])
    if any(len(a) != n for a in chunks.values()) or n > MAX_ROWS:
        raise ProtocolError(f"a layout has one start, end, first and last per chunk, at most {MAX_ROWS} chunks")
    # the sum in int64: int32 counts could wrap around to the chunks' number
    if (len(counts) and (counts.min() < 1 or tokens.min() < 0)) or int(counts.sum(dtype=np.int64)) != n:
        raise ProtocolError("each input has at least one chunk, the counts summing to the chunks, and tokens >= 0")
    starts, ends, firsts, lasts = chunks.values()
    if n and (
        starts.min() < 0
        or firsts.min() < 0
        or np.any(starts > ends)
        or np.any(firsts > lasts)
        or np.any(lasts > np.repeat(tokens, counts))
    ):
        raise ProtocolError("a chunk spans 0 <= start <= end characters and 0 <= first <= last <= its input's tokens")
    room = required_int(m, "rm") if m.get("rm") is not None else 0
    if room > MAX_ROWS:
        raise ProtocolError(f"a layout's room is at most {MAX_ROWS} tokens")
    return ChunkLayout(id=checked_id(m), **inputs, **chunks, room=room)


def _encode_job_batch(msg: JobBatch) -> dict[str, Any]:
    body = {
        "jb": msg.id,
        "bi": msg.batch,
        "m": msg.model,
        "di": msg.doc_ids,
        "x": msg.texts,
        "o": msg.options.to_wire(),
    }
    if msg.images is not None:
        body["im"] = msg.images
    if msg.chunking is not None:
        spec = msg.chunking.spec
        body |= {
            "sz": spec.size,
            "ov": spec.overlap,
            "bd": spec.boundary,
            "lc": msg.chunking.late,
            "wt": msg.chunking.with_text,
        }
    return body


def _decode_job_chunking(m: dict) -> JobChunking | None:
    if m.get("sz") is None:
        return None
    try:  # checked as a client's request is
        return JobChunking(
            ChunkSpec(m["sz"], m.get("ov", 0), m.get("bd", "token")), m.get("lc", False), m.get("wt", False)
        )
    except ServiceError as exc:
        raise ProtocolError(exc.message) from None


def _decode_job_batch(m: dict) -> JobBatch:
    doc_ids, texts = str_list(m, "di"), str_list(m, "x")
    images = None
    if m.get("im") is not None:
        if texts:
            raise ProtocolError("a job batch of images holds no texts beside them")
        images = image_files(m)
    if len(doc_ids) != len(images if images is not None else texts) or not doc_ids:
        raise ProtocolError("a job batch needs as many document ids as texts (or images), and at least one")
    options = EmbedOptions.from_wire(m.get("o", {}))
    if options.output == "spans":
        raise ProtocolError("a job batch carries no spans: output 'spans' is asked with them (an embed request)")
    chunking = _decode_job_chunking(m)
    if images is not None and chunking is not None:
        raise ProtocolError("a job batch of images is not chunked: chunks are cut from texts, an image is one vector")
    return JobBatch(
        id=checked_name(m, "jb"),
        batch=required_int(m, "bi"),
        model=checked_name(m, "m"),
        doc_ids=doc_ids,
        texts=texts,
        options=options,
        chunking=chunking,
        images=images,
    )


def _encode_job_result(msg: JobResult) -> dict[str, Any]:
    body = {
        "jb": msg.id,
        "bi": msg.batch,
        "s": msg.start,
        "di": msg.doc_ids,
        "dim": msg.dim,
        "dt": msg.dtype,
        "vec": msg.data,
        "tok": msg.tokens,
    } | _ragged_wire(msg.offsets, msg.indices)
    return body | ({} if msg.chunks is None else msg.chunks.to_wire())


def _decode_job_result(m: dict) -> JobResult:
    dim, dtype, data = required_int(m, "dim"), required(m, "dt", str), required(m, "vec", bytes)
    doc_ids = str_list(m, "di")
    count, offsets, indices = _payload_layout(m, data, dtype, dim, empty=True)
    if count != len(doc_ids):
        raise ProtocolError("payload does not hold one vector per document")
    start = required_int(m, "s")
    return JobResult(
        id=checked_name(m, "jb"),
        batch=required_int(m, "bi"),
        start=start,
        doc_ids=doc_ids,
        dim=dim,
        dtype=dtype,
        data=data,
        tokens=required_int(m, "tok"),
        offsets=offsets,
        indices=indices,
        chunks=ChunkRows.from_wire(m, len(doc_ids), start),
    )


def _encode_load_report(msg: LoadReport) -> dict[str, Any]:
    return {
        "wk": msg.id,
        "m": msg.model,
        "sub": msg.subject,
        "qt": msg.queued_tokens,
        "iv": msg.interval,
        "l": msg.leaving,
        "r": msg.rate,
    }


def _decode_load_report(m: dict) -> LoadReport:
    interval, leaving, rate = required_number(m, "iv"), m.get("l", False), optional_number(m, "r", 0.0)
    if not 0 < interval <= 60 or not isinstance(leaving, bool) or not 0 <= rate < 1e12:
        raise ProtocolError("load report: interval in (0, 60] seconds, a boolean leaving, a rate >= 0")
    return LoadReport(
        id=checked_name(m, "wk"),
        model=checked_name(m, "m"),
        subject=checked_name(m, "sub", MAX_ID),
        queued_tokens=required_int(m, "qt"),
        interval=interval,
        leaving=leaving,
        rate=rate,
    )


def _encode_rerank_request(msg: RerankRequest) -> dict[str, Any]:
    body = {
        "id": msg.id,
        "m": msg.model,
        "q": msg.query,
        "x": msg.texts,
        "dl": msg.deadline,
        "k": msg.top_n,
        "rs": msg.raw_scores,
        "tr": msg.truncate,
        "rt": msg.return_text,
    }
    if msg.vectors is not None:
        body |= {"cv": np.ascontiguousarray(msg.vectors, dtype=FLOAT32.dtype).tobytes(), "cd": msg.vectors.shape[1]}
    return body


def _decode_rerank_request(m: dict) -> RerankRequest:
    texts = str_list(m, "x")
    top_n = m.get("k")
    if top_n is not None and (not is_int(top_n) or top_n <= 0):
        raise ProtocolError("top_n must be a positive integer")
    vectors = None
    if m.get("cv") is not None:
        data, dim = required(m, "cv", bytes), required_int(m, "cd")
        if not 0 < dim <= MAX_DIMENSION or len(data) % (4 * dim):
            raise ProtocolError(
                f"candidate vectors must be n * dim little-endian float32 values, 0 < dim <= {MAX_DIMENSION}"
            )
        if texts:
            raise ProtocolError("give candidates as texts or as vectors, not both")
        vectors = np.frombuffer(data, dtype=FLOAT32.dtype).reshape(-1, dim)
        if len(vectors) > MAX_ROWS or not np.isfinite(vectors).all():
            raise ProtocolError(f"candidate vectors: at most {MAX_ROWS}, of finite values")
    return RerankRequest(
        id=checked_id(m),
        model=checked_name(m, "m"),
        query=required(m, "q", str),
        texts=texts,
        deadline=required_number(m, "dl"),
        top_n=top_n,
        raw_scores=optional_bool(m, "rs", False),
        truncate=optional_bool(m, "tr", True),
        vectors=vectors,
        return_text=optional_bool(m, "rt", False),
    )


def _encode_rerank_result(msg: RerankResult) -> dict[str, Any]:
    body = {
        "id": msg.id,
        "ci": _tokens_wire(msg.indices),
        "sc": np.ascontiguousarray(msg.scores, dtype=FLOAT32.dtype).tobytes(),
    }
    if msg.texts is not None:
        body["x"] = msg.texts
    return body


def _decode_rerank_result(m: dict) -> RerankResult:
    indices = int32_array(required(m, "ci", bytes), "indices")
    scores_buf = required(m, "sc", bytes)
    if len(scores_buf) != 4 * len(indices):
        raise ProtocolError("scores and indices differ in length")
    texts = str_list(m, "x") if m.get("x") is not None else None
    if texts is not None and len(texts) != len(indices):
        raise ProtocolError("texts and indices differ in length")
    return RerankResult(
        id=checked_id(m),
        indices=indices,
        scores=np.frombuffer(scores_buf, dtype=FLOAT32.dtype),
        texts=texts,
    )


# message type on the wire ("t") -> (encoder, decoder)
CODECS: dict[str, tuple[Callable[[Any], dict[str, Any]], Callable[[dict], Any]]] = {
    EmbedRequest.TYPE: (_encode_embed_request, _decode_embed_request),
    TokenChunk.TYPE: (_encode_token_chunk, _decode_token_chunk),
    EmbedResult.TYPE: (_encode_embed_result, _decode_embed_result),
    ErrorReply.TYPE: (_encode_error_reply, _decode_error_reply),
    Held.TYPE: (_encode_held, _decode_held),
    Replies.TYPE: (_encode_replies, _decode_replies),
    Cancel.TYPE: (_encode_cancel, _decode_cancel),
    Requests.TYPE: (_encode_requests, _decode_requests),
    TokenizeRequest.TYPE: (_encode_tokenize_request, _decode_tokenize_request),
    TokenizeResult.TYPE: (_encode_tokenize_result, _decode_tokenize_result),
    DecodeRequest.TYPE: (_encode_decode_request, _decode_decode_request),
    DecodeResult.TYPE: (_encode_decode_result, _decode_decode_result),
    ChunkRequest.TYPE: (_encode_chunk_request, _decode_chunk_request),
    ChunkLayout.TYPE: (_encode_chunk_layout, _decode_chunk_layout),
    JobBatch.TYPE: (_encode_job_batch, _decode_job_batch),
    JobResult.TYPE: (_encode_job_result, _decode_job_result),
    LoadReport.TYPE: (_encode_load_report, _decode_load_report),
    RerankRequest.TYPE: (_encode_rerank_request, _decode_rerank_request),
    RerankResult.TYPE: (_encode_rerank_result, _decode_rerank_result),
}
