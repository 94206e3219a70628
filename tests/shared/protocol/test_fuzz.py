"""Every NATS message decoder, fuzzed with hypothesis.

Valid messages round trip; anything else that arrives (random bytes, truncated or flipped encodings,
fields of the wrong type, huge or negative claims, NaN, deep nesting, very large strings) is refused
with ProtocolError, never another exception, in bounded time and memory. Whatever decode accepts,
encode writes back unchanged. The strategies are reused by tests/integration/test_hostile_nats.py.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import tracemalloc
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedfleet.services.gpu_worker.bulk import describe as describe_token_chunk
from embedfleet.services.tokenizer.bulk import describe as describe_job_batch
from embedfleet.shared.errors import GATEWAY_ONLY, ErrorCode
from embedfleet.shared.jobs.work_queue import BatchInfo, job_from_msg_id
from embedfleet.shared.protocol import (
    MAX_CANCEL_KEY,
    MAX_DIMENSION,
    MAX_ID,
    MAX_NAME,
    MAX_ROWS,
    MIN_CANCEL_KEY,
    OUTPUTS,
    POOLED_OUTPUTS,
    SPARSE_DTYPES,
    VERSION,
    Cancel,
    ChunkLayout,
    ChunkRequest,
    ChunkRows,
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
    Message,
    ProtocolError,
    Replies,
    RerankRequest,
    RerankResult,
    Spans,
    TokenChunk,
    TokenizeRequest,
    TokenizeResult,
    decode,
    decode_as,
    encode,
    row_bytes,
)
from embedfleet.shared.text_chunks import BOUNDARIES, ChunkSpec, JobChunking, TextChunk
from embedfleet.shared.vectors.forms import WIRE_FORMS

ROOT = Path(__file__).resolve().parents[3]
FUZZ = settings(
    # hypothesis's default count; make test-fast draws fewer, EMBEDFLEET_FUZZ_EXAMPLES=2000 digs deeper
    max_examples=int(os.environ.get("EMBEDFLEET_FUZZ_EXAMPLES", "100")),
    deadline=timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- valid messages -------------------------------------------------------------------------------

names = st.text(min_size=1, max_size=24)
ids = st.text(max_size=24)
finite = st.floats(allow_nan=False, allow_infinity=False)
u64 = st.integers(0, 2**64 - 1)
texts = st.lists(st.text(max_size=30), max_size=6)
timings = st.dictionaries(st.text(max_size=12), st.floats(0, 1e6), max_size=8)
cancel_keys = st.binary(min_size=MIN_CANCEL_KEY, max_size=MAX_CANCEL_KEY)


@st.composite
def options(draw, outputs: tuple[str, ...] = OUTPUTS) -> EmbedOptions:
    output = draw(st.sampled_from(outputs))
    return EmbedOptions(
        normalize=draw(st.none() | st.booleans()),
        dimensions=draw(st.none() | st.integers(1, MAX_DIMENSION)) if output in POOLED_OUTPUTS else None,
        dtype=draw(st.sampled_from(sorted(SPARSE_DTYPES if output == "sparse" else WIRE_FORMS))),
        truncate=draw(st.booleans()) and output != "spans",
        truncation_direction=draw(st.sampled_from(["right", "left"])),
        prompt_name=draw(st.none() | st.text(max_size=20)),
        input_type=draw(st.none() | st.sampled_from(["query", "document"])),
        output=output,
        sparse_top_k=draw(st.none() | st.integers(1, MAX_DIMENSION)) if output == "sparse" else None,
        sparse_threshold=draw(st.none() | finite) if output == "sparse" else None,
    )


unspanned = options(tuple(o for o in OUTPUTS if o != "spans"))  # messages that carry no spans
options = options()


def int32_arrays(n: int, low: int = -(2**31)) -> st.SearchStrategy[np.ndarray]:
    return st.lists(st.integers(low, 2**31 - 1), min_size=n, max_size=n).map(lambda v: np.array(v, dtype="<i4"))


@st.composite
def row_spans(draw, lengths: list[int], content: bool) -> Spans:
    """Spans of rows ``lengths`` tokens long: an EmbedRequest's (``content``: its texts' content tokens,
    (0, 0) in a row of none) or a TokenChunk's."""
    rows = []
    for n in lengths:
        if n == 0:
            rows.append([(0, 0)])
            continue
        pair = st.tuples(st.integers(0, n - 1), st.integers(1, n)).map(lambda p: (min(p), max(p[1], min(p) + 1)))
        rows.append(draw(st.lists(pair, min_size=1, max_size=min(n, 4))))
    return Spans.of(rows, lengths if content else None)


@st.composite
def embed_requests(draw) -> EmbedRequest:
    common = dict(
        id=draw(ids),
        model=draw(names),
        deadline=draw(finite),
        options=draw(options),
        held=draw(st.booleans()),
        replies=draw(st.booleans()),
        cancel_key=draw(st.none() | cancel_keys),
    )
    kind = "spans" if common["options"].output == "spans" else draw(st.sampled_from(["texts", "tokens", "pairs"]))
    if kind == "spans":
        inputs = draw(texts)
        lengths = draw(st.lists(st.integers(0, 300), min_size=len(inputs), max_size=len(inputs)))
        return EmbedRequest(texts=inputs, spans=draw(row_spans(lengths, content=True)), **common)
    if kind == "texts":
        return EmbedRequest(texts=draw(texts), **common)
    if kind == "tokens":
        arrays = st.integers(0, 8).flatmap(int32_arrays)
        return EmbedRequest(texts=[], token_ids=draw(st.lists(arrays, max_size=4)), **common)
    pairs = st.lists(st.tuples(st.text(max_size=20), st.text(max_size=20)), max_size=4)
    return EmbedRequest(texts=[], pairs=draw(pairs), **common)


@st.composite
def token_chunks(draw, job: bool | None = None) -> TokenChunk:
    lengths = draw(st.lists(st.integers(1, 8), min_size=1, max_size=6))
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype("<i4")
    n, rows = int(cu[-1]), len(lengths)
    with_job = draw(st.booleans()) if job is None else job
    opts = draw(unspanned if with_job else options)
    chunked = with_job and draw(st.booleans())
    start = draw(st.integers(4 if chunked else 0, 1000))  # a chunked row's document may begin 3 rows before
    return TokenChunk(
        id=draw(ids),
        model=draw(names),
        start=start,
        total=draw(st.integers(start + rows + (3 if chunked else 0), MAX_ROWS)),
        input_ids=draw(int32_arrays(n)),
        cu_seqlens=cu,
        deadline=draw(finite),
        options=opts,
        timings=draw(timings),
        token_types=draw(st.none() | int32_arrays(n, low=0)),
        job=draw(names) if with_job else None,
        batch=draw(u64) if with_job else 0,
        doc_ids=draw(st.lists(st.text(max_size=10), min_size=rows, max_size=rows)) if with_job else None,
        prompt_tokens=draw(st.integers(0, 300)),
        held=draw(st.booleans()),
        replies=draw(st.booleans()),
        spans=draw(row_spans(lengths, content=False)) if opts.output == "spans" else None,
        chunks=draw(chunk_rows(rows)) if chunked else None,
        cancel_key=None if with_job else draw(st.none() | cancel_keys),
    )


@st.composite
def chunk_rows(draw, rows: int) -> ChunkRows:
    """Chunked rows as a tokenizer makes them: documents one after another, each's chunks in order (the
    first's first chunks may lie before these rows, up to 3 of them, the last's last after them, up to 3)."""
    counts = draw(st.lists(st.integers(1, 4), min_size=1, max_size=rows))
    first = draw(st.integers(0, counts[0] - 1))
    flat = [(d, k, n) for d, n in enumerate(counts) for k in range(n)][first : first + rows]
    while len(flat) < rows:
        flat.append((len(counts), 0, 1))
        counts.append(1)
    starts = draw(st.lists(st.integers(0, 2**31 - 1), min_size=rows, max_size=rows))
    spans = [(d, k, n, s, s + draw(st.integers(0, 2**31 - 1 - s))) for (d, k, n), s in zip(flat, starts)]
    texts = draw(st.none() | st.lists(st.text(max_size=10), min_size=rows, max_size=rows))
    return ChunkRows.of(len(counts) + draw(st.integers(0, 3)), spans, texts)


@st.composite
def payloads(draw, inputs: int) -> dict:
    """dim, dtype, data, offsets, indices of ``inputs`` results: one vector each, several (tokens,
    multivector) or (index, value) pairs (sparse)."""
    kind = draw(st.sampled_from(["dense", "ragged", "sparse"]))
    dim = draw(st.integers(1, 16))
    dtype = draw(st.sampled_from(sorted(SPARSE_DTYPES if kind == "sparse" else WIRE_FORMS)))
    if kind == "dense":
        size = inputs * row_bytes(dtype, dim)  # bit-packed forms: ceil(dim / 8) bytes a row
        return dict(dim=dim, dtype=dtype, data=draw(st.binary(min_size=size, max_size=size)))
    counts = draw(st.lists(st.integers(0, 5), min_size=inputs, max_size=inputs))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype("<i4")
    entries = int(offsets[-1])
    if kind == "ragged":
        size = entries * row_bytes(dtype, dim)
        return dict(dim=dim, dtype=dtype, data=draw(st.binary(min_size=size, max_size=size)), offsets=offsets)
    size = entries * WIRE_FORMS[dtype].dtype.itemsize
    indices = np.array(draw(st.lists(st.integers(0, dim - 1), min_size=entries, max_size=entries)), dtype="<i4")
    return dict(
        dim=dim, dtype=dtype, data=draw(st.binary(min_size=size, max_size=size)), offsets=offsets, indices=indices
    )


@st.composite
def embed_results(draw) -> EmbedResult:
    rows = draw(st.integers(1, 4))
    start = draw(st.integers(0, 1000))
    payload = draw(payloads(rows))
    if not payload["data"] and "offsets" not in payload:
        payload["data"] = b"\x00" * row_bytes(payload["dtype"], payload["dim"]) * rows
    return EmbedResult(
        id=draw(ids),
        start=start,
        total=draw(st.integers(start + rows, MAX_ROWS)),
        tokens=draw(u64),
        timings=draw(timings),
        **payload,
    )


@st.composite
def job_results(draw) -> JobResult:
    docs = draw(st.integers(0, 4))
    return JobResult(
        id=draw(names),
        batch=draw(u64),
        start=draw(u64),
        doc_ids=draw(st.lists(st.text(max_size=10), min_size=docs, max_size=docs)),
        tokens=draw(u64),
        **draw(payloads(docs)),
        chunks=draw(st.none() | chunk_rows(docs)) if docs else None,
    )


@st.composite
def job_batches(draw) -> JobBatch:
    n = draw(st.integers(1, 5))
    doc_ids = draw(st.lists(st.text(max_size=10), min_size=n, max_size=n))
    if draw(st.booleans()):  # a batch of images: one file a document, no texts, never chunked
        images = draw(st.lists(st.binary(min_size=1, max_size=40), min_size=n, max_size=n))
        return JobBatch(draw(names), draw(u64), draw(names), doc_ids, [], draw(unspanned), images=images)
    return JobBatch(
        id=draw(names),
        batch=draw(u64),
        model=draw(names),
        doc_ids=doc_ids,
        texts=draw(st.lists(st.text(max_size=30), min_size=n, max_size=n)),
        options=draw(unspanned),
        chunking=draw(st.none() | st.builds(JobChunking, chunk_specs(), st.booleans(), st.booleans())),
    )


@st.composite
def chunk_specs(draw) -> ChunkSpec:
    size = draw(st.integers(1, 2**64 - 1))
    return ChunkSpec(size, draw(st.integers(0, min(size - 1, 2**63))), draw(st.sampled_from(BOUNDARIES)))


@st.composite
def rerank_requests(draw) -> RerankRequest:
    vectors = None
    candidates = draw(texts)
    if draw(st.booleans()):
        rows, dim = draw(st.integers(0, 4)), draw(st.integers(1, 8))
        value = st.floats(width=32, allow_nan=False, allow_infinity=False)
        values = st.lists(value, min_size=rows * dim, max_size=rows * dim)
        vectors, candidates = np.array(draw(values), dtype="<f4").reshape(rows, dim), []
    return RerankRequest(
        id=draw(ids),
        model=draw(names),
        query=draw(st.text(max_size=30)),
        texts=candidates,
        deadline=draw(finite),
        top_n=draw(st.none() | st.integers(1, 2**64 - 1)),
        raw_scores=draw(st.booleans()),
        truncate=draw(st.booleans()),
        vectors=vectors,
        return_text=draw(st.booleans()),
    )


@st.composite
def rerank_results(draw) -> RerankResult:
    n = draw(st.integers(0, 5))
    scores = st.binary(min_size=4 * n, max_size=4 * n).map(lambda b: np.frombuffer(b, dtype="<f4"))
    return RerankResult(
        id=draw(ids),
        indices=draw(int32_arrays(n)),
        scores=draw(scores),
        texts=draw(st.none() | st.lists(st.text(max_size=10), min_size=n, max_size=n)),
    )


@st.composite
def chunk_requests(draw) -> ChunkRequest:
    return ChunkRequest(
        id=draw(ids),
        model=draw(names),
        texts=draw(texts),
        spec=draw(chunk_specs()),
        prompt_name=draw(st.none() | st.text(max_size=20)),
        input_type=draw(st.none() | st.sampled_from(["query", "document"])),
    )


@st.composite
def text_chunks(draw) -> tuple[list[TextChunk], int]:
    """One input's chunks (as any layout may hold them: spans, not necessarily a cut's), and its tokens."""
    tokens = draw(st.integers(0, 2**31 - 1))
    spans = st.tuples(
        st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1), st.integers(0, tokens), st.integers(0, tokens)
    )
    chunks = [
        TextChunk(min(a, b), max(a, b), min(f, t), max(f, t))
        for a, b, f, t in draw(st.lists(spans, min_size=1, max_size=4))
    ]
    return chunks, tokens


@st.composite
def chunk_layouts(draw) -> ChunkLayout:
    inputs = draw(st.lists(text_chunks(), max_size=4))
    return ChunkLayout.of(draw(ids), [c for c, _ in inputs], [t for _, t in inputs])


token_tuples = st.tuples(
    st.integers(-(2**63), 2**64 - 1), st.text(max_size=8), st.booleans(), st.none() | u64, st.none() | u64
)
VALID: dict[type, st.SearchStrategy] = {
    EmbedRequest: embed_requests(),
    TokenChunk: token_chunks(),
    EmbedResult: embed_results(),
    ErrorReply: st.builds(
        ErrorReply,
        id=ids,
        code=st.sampled_from([c for c in ErrorCode if c not in GATEWAY_ONLY]),
        message=st.text(max_size=40),
        row=st.none() | u64,
    ),
    Cancel: st.builds(Cancel, id=ids, key=cancel_keys, deadline=finite),
    Held: st.builds(Held, id=ids, start=st.integers(0, MAX_ROWS - 1), rows=st.just(1), holder=names),
    Replies: st.integers(0, 4).flatmap(
        lambda n: st.builds(
            Replies,
            subjects=st.lists(names, min_size=n, max_size=n),
            messages=st.lists(st.binary(max_size=30), min_size=n, max_size=n),
        )
    ),
    TokenizeRequest: st.builds(
        TokenizeRequest,
        id=ids,
        model=names,
        texts=texts,
        add_special_tokens=st.booleans(),
        prompt_name=st.none() | st.text(max_size=20),
    ),
    TokenizeResult: st.builds(TokenizeResult, id=ids, tokens=st.lists(st.lists(token_tuples, max_size=4), max_size=3)),
    DecodeRequest: st.builds(
        DecodeRequest,
        id=ids,
        model=names,
        ids=st.lists(st.integers(0, 8).flatmap(int32_arrays), max_size=4),
        skip_special_tokens=st.booleans(),
    ),
    DecodeResult: st.builds(DecodeResult, id=ids, texts=texts),
    ChunkRequest: chunk_requests(),
    ChunkLayout: chunk_layouts(),
    JobBatch: job_batches(),
    JobResult: job_results(),
    LoadReport: st.builds(
        LoadReport,
        id=names,
        model=names,
        subject=names,
        queued_tokens=u64,
        interval=st.floats(0, 60, exclude_min=True),
        leaving=st.booleans(),
        rate=st.floats(0, 1e12, exclude_max=True),
    ),
    RerankRequest: rerank_requests(),
    RerankResult: rerank_results(),
}
KINDS = sorted(VALID, key=lambda k: k.TYPE)


def plain(x: Any) -> Any:
    """A message as comparable plain values (arrays as shape + little-endian bytes, so NaN compares)."""
    if dataclasses.is_dataclass(x):
        return type(x).__name__, {f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, np.ndarray):
        return "array", x.shape, x.dtype.kind, x.astype(x.dtype.newbyteorder("<")).tobytes()
    if isinstance(x, (list, tuple)):
        return type(x).__name__, [plain(v) for v in x]
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x


# -- hostile input ----------------------------------------------------------------------------------

HUGE_INTS = [-1, -(2**31), -(2**63), 2**31 - 1, 2**31, 2**32, 2**40, 2**63 - 1, 2**64 - 1]
junk_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from(HUGE_INTS),
    st.floats(),  # NaN and infinities included
    st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.sampled_from([("x", 100_000), (b"\x00", 100_001), ("é", MAX_NAME + 1)]).map(lambda r: r[0] * r[1]),  # large
)
junk = st.recursive(
    junk_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


def deeply_nested(depth: int) -> bytes:
    """A msgpack value nested ``depth`` arrays deep (built by hand: packb refuses deep nesting)."""
    return b"\x91" * depth + b"\xc0"


def with_raw_field(body: dict, key: str, raw: bytes) -> bytes:
    """``body`` packed as a map, with ``key`` set to the already packed value ``raw``."""
    rest = {k: v for k, v in body.items() if k != key}
    packer = msgpack.Packer(use_bin_type=True)
    fields = b"".join(packer.pack(k) + packer.pack(v) for k, v in rest.items())
    return packer.pack_map_header(len(rest) + 1) + fields + packer.pack(key) + raw


@st.composite
def mutated(draw, valid: st.SearchStrategy) -> bytes:
    """A valid message's encoding, damaged one way: cut, bytes flipped or inserted, a field (or a field
    of a nested map) replaced by junk or removed, or set to a deeply nested value."""
    data = encode(draw(valid))
    how = draw(st.sampled_from(["truncate", "flip", "insert", "field", "nested", "drop", "deep"]))
    if how == "truncate":
        return data[: draw(st.integers(0, len(data) - 1))]
    if how == "flip":
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            out[draw(st.integers(0, len(out) - 1))] = draw(st.integers(0, 255))
        return bytes(out)
    if how == "insert":
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.binary(min_size=1, max_size=16)) + data[at:]
    body = msgpack.unpackb(data, raw=False)
    key = draw(st.sampled_from([*sorted(body), "zz"]))
    if how == "deep":
        return with_raw_field(body, key, deeply_nested(draw(st.integers(1, 3000))))
    if how == "drop":
        body.pop(key, None)
    elif how == "nested" and isinstance(body.get("o"), dict):
        body["o"][draw(st.sampled_from([*sorted(body["o"]), "zz"]))] = draw(junk)
    elif how == "nested" and isinstance(body.get("tm"), dict):
        body["tm"][draw(st.text(max_size=80))] = draw(junk)
    else:
        body[key] = draw(junk)
    return msgpack.packb(body, use_bin_type=True)


# msgpack values of every kind, packed: maps, lists, ext types, odd keys
msgpack_values = st.recursive(
    junk_scalars | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=8)),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3) | st.binary(max_size=3), inner, max_size=4)
    ),
    max_leaves=10,
).map(lambda v: msgpack.packb(v, use_bin_type=True))
# every key a message has (docs/protocol.md), and a few short ones none has
WIRE_KEYS = sorted(
    {
        "rows",
        "vec",
        "tkd",
        "jb",
        "bi",
        "wk",
        "sub",
        "qt",
        "iv",
        "ci",
        "n",
        "b",
        "d",
        "i",
        "id",
        "m",
        "x",
        "dl",
        "o",
        "tk",
        "pr",
        "s",
        "ids",
        "cu",
        "tt",
        "tm",
        "pt",
        "di",
        "dim",
        "dt",
        "tok",
        "of",
        "ix",
        "c",
        "e",
        "row",
        "sp",
        "pn",
        "ss",
        "l",
        "r",
        "q",
        "k",
        "rs",
        "tr",
        "rt",
        "cv",
        "cd",
        "sc",
        "it",
        "sz",
        "ov",
        "bd",
        "cc",
        "ct",
        "cs",
        "ce",
        "cf",
        "cl",
    }
)
protocol_shaped = st.fixed_dictionaries(
    {"v": st.sampled_from([1, VERSION]) | junk_scalars, "t": st.sampled_from([k.TYPE for k in KINDS]) | junk_scalars},
    optional=dict.fromkeys(WIRE_KEYS, junk),
).map(lambda body: msgpack.packb(body, use_bin_type=True))


def hostile(valid: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    """Payloads to throw at a decoder (or a subject) whose messages look like ``valid``'s."""
    return st.one_of(st.binary(max_size=512), msgpack_values, protocol_shaped, mutated(valid))


def _decode_measured(data: bytes) -> tuple[Message | ProtocolError, int]:
    tracemalloc.start()
    try:
        out: Message | ProtocolError = decode(data)
    except ProtocolError as exc:
        out = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return out, peak


def decode_safely(data: bytes) -> Message | ProtocolError:
    """decode(data) -> a message, or the ProtocolError; any other exception fails the test. Memory stays
    within a small multiple of the input; what decodes, encodes back to the same message."""
    out, peak = _decode_measured(data)
    if peak > 64 * len(data) + (1 << 20):
        # once only, a first use can allocate for the process (a lazy import, a cache): measure again
        out, peak = _decode_measured(data)
    assert peak <= 64 * len(data) + (1 << 20), f"decoding {len(data)} bytes took {peak} bytes"
    if isinstance(out, ProtocolError):
        assert 0 < len(str(out)) <= 300, str(out)[:1000]
    else:
        assert plain(decode(encode(out))) == plain(out)
    return out


# -- properties -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.TYPE)
@FUZZ
@given(data=st.data())
def test_valid_messages_round_trip(kind, data):
    msg = data.draw(VALID[kind])
    out = decode_as(encode(msg), kind)
    assert plain(out) == plain(msg)


@FUZZ
@given(data=st.binary(max_size=2048))
def test_arbitrary_bytes_are_refused_or_valid(data):
    decode_safely(data)


@FUZZ
@given(data=msgpack_values | protocol_shaped)
def test_arbitrary_msgpack_is_refused_or_valid(data):
    decode_safely(data)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.TYPE)
@FUZZ
@given(data=st.data())
def test_mutated_encodings_are_refused_or_valid(kind, data):
    decode_safely(data.draw(mutated(VALID[kind])))


def _tokens(**fields) -> bytes:
    batch = TokenChunk("r", "m", 0, 2, np.array([101, 7, 102], "<i4"), np.array([0, 1, 3], "<i4"), 9.0)
    body = msgpack.unpackb(encode(batch))
    return msgpack.packb({**body, **fields}, use_bin_type=True)


def _message(kind: str, **fields) -> bytes:
    return msgpack.packb({"v": VERSION, "t": kind, **fields}, use_bin_type=True)


OK_EMBED = dict(id="a", m="m", x=["a"], dl=1.0)
OK_CHUNK = dict(id="a", m="m", x=["a"], sz=8, ov=0, bd="token")


def _layout(**fields) -> bytes:
    """A valid layout of two inputs (2 chunks and 1) with ``fields`` replaced."""
    layout = ChunkLayout.of("r", [[TextChunk(0, 5, 0, 2), TextChunk(4, 9, 1, 3)], [TextChunk(0, 0, 0, 0)]], [3, 0])
    body = msgpack.unpackb(encode(layout))
    return msgpack.packb({**body, **{k: np.array(v, "<i4").tobytes() for k, v in fields.items()}}, use_bin_type=True)


def _i4(*values: int) -> list[int]:
    return list(values)


HUGE_CLAIMS = {
    # msgpack headers that claim far more than the bytes that follow
    "array32 of 2**32-1": b"\xdd\xff\xff\xff\xff\xc0",
    "map32 of 2**32-1": b"\xdf\xff\xff\xff\xff\xa1v\x01",
    "bin32 of 4 GB": b"\xc6\xff\xff\xff\xff\x00",
    "str32 of 4 GB": b"\xdb\xff\xff\xff\xff\x00",
    "ext32 of 4 GB": b"\xc9\xff\xff\xff\xff\x01\x00",
    "texts claiming 2**32-1": with_raw_field(
        {"v": VERSION, "t": "embed", "id": "a", "m": "m", "dl": 1.0}, "x", b"\xdd\xff\xff\xff\xff"
    ),
    "ids claiming 4 GB": with_raw_field(msgpack.unpackb(_tokens()), "ids", b"\xc6\xff\xff\xff\xff\x00\x00"),
    "nested 100000 deep": deeply_nested(100_000),
    "field nested 100000 deep": with_raw_field({"v": VERSION, "t": "embed"}, "x", deeply_nested(100_000)),
    "version nested 1000 deep": with_raw_field({"t": "embed"}, "v", deeply_nested(1000)),
    # a token batch whose offsets claim 2**40 tokens (or wrap around int32) with three ids behind them
    "cu claiming 2**31-1 tokens": _tokens(cu=np.array([0, 1, 2**31 - 1], "<i4").tobytes()),
    "cu wrapping around int32": _tokens(cu=np.array([0, 2**31 - 1, -(2**31), -1, 3], "<i4").tobytes(), rows=9),
    "cu not increasing": _tokens(cu=np.array([0, 2, 1, 3], "<i4").tobytes(), rows=9),
    "cu not ending at len(ids)": _tokens(cu=np.array([0, 1, 4], "<i4").tobytes()),
    "ids not whole int32": _tokens(ids=b"\x01\x00\x00\x00\x02"),
    "total 2**40 rows": _tokens(rows=2**40),
    "start 2**64-1": _tokens(s=2**64 - 1),
    "negative start": _tokens(s=-1),
    "negative token type": _tokens(tt=np.array([0, -1, 0], "<i4").tobytes()),
    "deadline NaN": _tokens(dl=float("nan")),
    "deadline inf": _message("embed", **{**OK_EMBED, "dl": float("inf")}),
    "timings NaN": _tokens(tm={"tokenize": float("nan")}),
    "timings stage name 100 KB": _tokens(tm={"x" * 100_000: 1.0}),
    "dimension 2**40": _message("result", id="a", s=0, rows=1, dim=2**40, dt="f4", vec=b"\x00" * 4, tok=1),
    "result rows past total": _message("result", id="a", s=0, rows=1, dim=1, dt="f4", vec=b"\x00" * 8, tok=1),
    "result bytes not whole rows": _message("result", id="a", s=0, rows=9, dim=2, dt="f4", vec=b"\x00" * 12, tok=1),
    "offsets past the payload": _message(
        "result",
        id="a",
        s=0,
        rows=1,
        dim=1,
        dt="f4",
        vec=b"\x00" * 4,
        tok=1,
        of=np.array([0, 2**31 - 1], "<i4").tobytes(),
    ),
    "offsets wrapping around int32": _message(
        "result",
        id="a",
        s=0,
        rows=3,
        dim=1,
        dt="f4",
        vec=b"\x00" * 4,
        tok=1,
        of=np.array([0, 2**31 - 1, -(2**31), 1], "<i4").tobytes(),
    ),
    "offsets decreasing": _message(
        "result",
        id="a",
        s=0,
        rows=3,
        dim=1,
        dt="f4",
        vec=b"\x00" * 8,
        tok=1,
        of=np.array([0, 2, 1, 2], "<i4").tobytes(),
    ),
    "offsets claiming 2**40 inputs": _message(
        "result", id="a", s=0, rows=1, dim=1, dt="f4", vec=b"", tok=1, of=b"\xc6\xff\xff\xff\xff"
    ),
    "sparse index past dim": _message(
        "result",
        id="a",
        s=0,
        rows=1,
        dim=4,
        dt="f4",
        vec=b"\x00" * 4,
        tok=1,
        of=np.array([0, 1], "<i4").tobytes(),
        ix=np.array([4], "<i4").tobytes(),
    ),
    "sparse negative index": _message(
        "result",
        id="a",
        s=0,
        rows=1,
        dim=4,
        dt="f4",
        vec=b"\x00" * 4,
        tok=1,
        of=np.array([0, 1], "<i4").tobytes(),
        ix=np.array([-1], "<i4").tobytes(),
    ),
    "sparse values and indices differ": _message(
        "result",
        id="a",
        s=0,
        rows=1,
        dim=4,
        dt="f4",
        vec=b"\x00" * 8,
        tok=1,
        of=np.array([0, 2], "<i4").tobytes(),
        ix=np.array([1], "<i4").tobytes(),
    ),
    "sparse int8 values": _message(
        "result",
        id="a",
        s=0,
        rows=1,
        dim=4,
        dt="i1",
        vec=b"\x00",
        tok=1,
        of=np.array([0, 1], "<i4").tobytes(),
        ix=np.array([1], "<i4").tobytes(),
    ),
    "sparse without offsets": _message(
        "result", id="a", s=0, rows=1, dim=4, dt="f4", vec=b"\x00" * 4, tok=1, ix=np.array([1], "<i4").tobytes()
    ),
    "job result offsets not one per document": _message(
        "jobresult",
        jb="j",
        bi=0,
        s=0,
        di=["a", "b"],
        dim=1,
        dt="f4",
        vec=b"\x00" * 4,
        tok=1,
        of=np.array([0, 1], "<i4").tobytes(),
    ),
    "options output unknown": _message("embed", **OK_EMBED, o={"out": "everything"}),
    "options sparse top_k 2**64": _message("embed", **OK_EMBED, o={"out": "sparse", "sk": 2**64 - 1}),
    "options sparse threshold NaN": _message("embed", **OK_EMBED, o={"out": "sparse", "sth": float("nan")}),
    "options sparse as binary": _message("embed", **OK_EMBED, o={"out": "sparse", "dt": "b1"}),
    "job result not one vector per document": _message(
        "jobresult", jb="j", bi=0, s=0, di=["a"], dim=2**16, dt="f4", vec=b"\x00" * 4, tok=1
    ),
    "rerank candidate dim 2**40": _message("rerank", id="a", m="m", q="q", x=[], dl=1.0, cv=b"\x00" * 8, cd=2**40),
    "rerank candidate NaN": _message(
        "rerank", id="a", m="m", q="q", x=[], dl=1.0, cv=np.array([1.0, float("nan")], "<f4").tobytes(), cd=2
    ),
    "load rate as text": _message("load", wk="w", m="m", sub="s", qt=0, iv=0.05, r="1e3"),
    "load rate inf": _message("load", wk="w", m="m", sub="s", qt=0, iv=0.05, r=float("inf")),
    "options dtype a list": _message("embed", **OK_EMBED, o={"dt": ["f4"]}),
    "options dimensions huge": _message("embed", **OK_EMBED, o={"d": 2**64 - 1}),
    "type a list": msgpack.packb({"v": VERSION, "t": [1, 2]}),
    "type a map": msgpack.packb({"v": VERSION, "t": {"a": 1}}),
    "version true": msgpack.packb({"v": True, "t": "error", "id": "a", "c": "internal", "e": "x"}),
    "version 1.0": msgpack.packb({"v": 1.0, "t": "error", "id": "a", "c": "internal", "e": "x"}),
    "version 100 KB string": msgpack.packb({"v": "x" * 100_000, "t": "embed"}),
    "id longer than MAX_ID": _message("embed", **{**OK_EMBED, "id": "x" * (MAX_ID + 1)}),
    "model longer than MAX_NAME": _message("embed", **{**OK_EMBED, "m": "x" * (MAX_NAME + 1)}),
    "empty model": _message("embed", **{**OK_EMBED, "m": ""}),
    "job longer than MAX_NAME": _tokens(jb="j" * (MAX_NAME + 1), di=["a", "b"], bi=0),
    "job a number": _tokens(jb=7, di=["a", "b"], bi=0),
    "decode ids claiming 2**32-1 sequences": with_raw_field(
        {"v": VERSION, "t": "decode", "id": "a", "m": "m"}, "tk", b"\xdd\xff\xff\xff\xff"
    ),
    "decode ids claiming 4 GB": with_raw_field(
        {"v": VERSION, "t": "decode", "id": "a", "m": "m"}, "tk", b"\x91\xc6\xff\xff\xff\xff\x00"
    ),
    "decode ids not whole int32": _message("decode", id="a", m="m", tk=[b"\x01\x00\x00"]),
    "decode ids as numbers": _message("decode", id="a", m="m", tk=[[101, 102]]),
    "decode ids a map": _message("decode", id="a", m="m", tk={"a": b"\x00" * 4}),
    "decode without a model": _message("decode", id="a", tk=[b"\x00" * 4]),
    "decode skip_special_tokens a string": _message("decode", id="a", m="m", tk=[b"\x00" * 4], ss="yes"),
    "decoded texts as bytes": _message("decoded", id="a", x=[b"text"]),
    "decoded texts claiming 2**32-1": with_raw_field(
        {"v": VERSION, "t": "decoded", "id": "a"}, "x", b"\xdd\xff\xff\xff\xff"
    ),
    "chunk size 0": _message("chunk", **{**OK_CHUNK, "sz": 0}),
    "chunk size a float": _message("chunk", **{**OK_CHUNK, "sz": 8.0}),
    "chunk overlap as large as size": _message("chunk", **{**OK_CHUNK, "ov": 8}),
    "chunk overlap negative": _message("chunk", **{**OK_CHUNK, "ov": -1}),
    "chunk boundary 100 KB": _message("chunk", **{**OK_CHUNK, "bd": "x" * 100_000}),
    "chunk prompt name a number": _message("chunk", **{**OK_CHUNK, "pn": 7}),
    "chunk texts claiming 2**32-1": with_raw_field(
        {"v": VERSION, "t": "chunk", "id": "a", "m": "m", "sz": 8}, "x", b"\xdd\xff\xff\xff\xff"
    ),
    "layout starts claiming 4 GB": with_raw_field(msgpack.unpackb(_layout()), "cs", b"\xc6\xff\xff\xff\xff\x00"),
    "layout counts not whole int32": msgpack.packb({**msgpack.unpackb(_layout()), "cc": b"\x02\x00\x00\x00\x01"}),
    "layout counts summing past the chunks": _layout(cc=_i4(2, 2), ct=_i4(3, 0)),
    "layout counts summing short of the chunks": _layout(cc=_i4(1, 1)),
    "layout counts wrapping around int32": _layout(cc=_i4(2**31 - 1, 2**31 - 1, 4), ct=_i4(3, 0, 0)),
    "layout input of no chunks": _layout(cc=_i4(3, 0)),
    "layout tokens not one per input": _layout(ct=_i4(3)),
    "layout negative tokens": _layout(ct=_i4(3, -1)),
    "layout ends not one per chunk": _layout(ce=_i4(5, 9)),
    "layout start past end": _layout(cs=_i4(0, 10, 0)),
    "layout negative start": _layout(cs=_i4(-1, 4, 0), ce=_i4(-1, 9, 0)),
    "layout first past last": _layout(cf=_i4(0, 4, 0)),
    "layout negative first": _layout(cf=_i4(-5, 1, 0)),
    "layout last past the input's tokens": _layout(cl=_i4(2, 3, 1)),
    "pickle": b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00\x8c\x01a\x94.",
}


@pytest.mark.parametrize("data", HUGE_CLAIMS.values(), ids=HUGE_CLAIMS.keys())
def test_hostile_claims_are_refused_cheaply(data):
    assert isinstance(decode_safely(data), ProtocolError)


def test_more_inputs_than_max_rows_are_refused():
    data = _message("embed", id="a", m="m", x=[""] * (MAX_ROWS + 1), dl=1.0)
    assert isinstance(decode_safely(data), ProtocolError)
    data = _message("decode", id="a", m="m", tk=[b""] * (MAX_ROWS + 1))
    assert isinstance(decode_safely(data), ProtocolError)


msg_ids = st.one_of(
    st.text(max_size=40),
    st.builds(
        lambda job, nums: ":".join([job, *nums]),
        st.text(max_size=12),
        st.lists(st.text("0123456789²٣", min_size=1, max_size=8) | st.sampled_from(["9" * 5000]), max_size=3),
    ),
    st.sampled_from(["j" * (MAX_NAME + 1) + ":1:2", "job:" + "1" * 5000]),
)


@FUZZ
@given(msg_id=msg_ids, data=hostile(VALID[JobBatch]) | hostile(token_chunks(job=True)))
def test_dead_letter_descriptions_never_fail(msg_id, data):
    """What a dead letter records of a bulk batch comes from its payload, else from its message id
    header: both untrusted. Describing one never raises, and names a job only by a usable name."""
    headers = {"Nats-Msg-Id": msg_id}
    for info in (
        job_from_msg_id(headers, 1),
        job_from_msg_id(headers, 2),
        describe_job_batch(data, headers),
        describe_token_chunk(data, headers),
    ):
        assert isinstance(info, BatchInfo)
        assert info.job is None or 0 < len(info.job) <= MAX_NAME


# -- no pickle anywhere ---------------------------------------------------------------------------

UNSAFE_MODULES = {"pickle", "_pickle", "cPickle", "cloudpickle", "dill", "marshal", "shelve", "joblib"}


def _sources() -> list[Path]:
    return sorted(p for d in ("shared", "services") for p in (ROOT / d).rglob("*.py"))


def test_sources_never_unpickle():
    """No module of shared/ or services/ imports a pickle-like loader, asks numpy to allow pickles, or
    calls torch.load (a pickle loader): weights come from safetensors, messages from msgpack."""
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                found += [where for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
            elif (
                (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES)
                or (isinstance(node, ast.keyword) and node.arg == "allow_pickle")
                or (
                    isinstance(node, ast.Attribute)
                    and node.attr == "load"
                    and isinstance(node.value, ast.Name)
                    and node.value.id in ("torch", "pickle", "marshal")
                )
            ):
                found.append(where)
    assert len(_sources()) > 20 and found == []
