"""The codec's cost on the hot messages, against msgspec's typed msgpack structs, in one run.

    python3 -m bench.protocol            # needs msgspec for the comparison (pip install msgspec)

Per message: microseconds for one encode plus one checked decode, best of several rounds, for
shared/protocol's codec and for the same message as a msgspec Struct (wire keys as field names, the
same checks: types and bounds by msgspec, the array invariants in __post_init__, arrays through
enc_hook / dec_hook), and their ratio. The messages: a TokenChunk of 32 x 128 tokens, an EmbedResult
of 32 x 384 float32 and a JobBatch of 64 texts of about 300 characters. docs/protocol.md records a run.
"""

import argparse
import math
import time
from collections.abc import Callable
from typing import Annotated, Any

import numpy as np

from shared.protocol import (
    MAX_ID,
    MAX_NAME,
    MAX_ROWS,
    EmbedOptions,
    EmbedResult,
    JobBatch,
    ProtocolError,
    TokenChunk,
    decode_as,
    encode,
)

ROWS, TOKENS, DIM, TEXTS = 32, 128, 384, 64


def messages() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    cu = np.arange(0, ROWS * TOKENS + 1, TOKENS, dtype="<i4")
    ids = rng.integers(0, 30_000, ROWS * TOKENS, dtype=np.int32)
    words = [
        "the",
        "of",
        "a",
        "to",
        "in",
        "is",
        "for",
        "on",
        "that",
        "with",
        "as",
        "by",
        "at",
        "from",
        "this",
        "be",
        "an",
        "are",
    ]
    texts = [" ".join(rng.choice(words, 80)) for _ in range(TEXTS)]
    return {
        "TokenChunk 32x128": TokenChunk(
            "req-1", "all-MiniLM-L6-v2", 0, ROWS, ids, cu, time.time() + 30, timings={"tokenize": 0.001}
        ),
        "EmbedResult 32x384 f4": EmbedResult(
            "req-1",
            0,
            ROWS,
            DIM,
            "f4",
            rng.random((ROWS, DIM), "<f4").tobytes(),
            ROWS * TOKENS,
            {"tokenize": 0.001, "queue": 0.002, "inference": 0.01},
        ),
        "JobBatch 64 texts": JobBatch(
            "job1",
            0,
            "all-MiniLM-L6-v2",
            [f"doc-{i}" for i in range(TEXTS)],
            texts,
            EmbedOptions(input_type="document"),
        ),
    }


def timed(fn: Callable[[], object], rounds: int = 7, number: int = 2000) -> float:
    """Best microseconds per call over ``rounds`` of ``number`` calls."""
    best = math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best * 1e6


def _finite(value: float, what: str) -> None:
    if not math.isfinite(value):
        raise ProtocolError(f"{what} must be finite")


def _finite_timings(timings: dict[str, float]) -> None:
    for seconds in timings.values():
        _finite(seconds, "timings")


def _bounded_types() -> tuple[Any, Any, Any, Any, Any]:
    """msgspec's annotations for the codec's bounds: a name, a count, a request id, a row count, timings."""
    from msgspec import Meta

    name = Annotated[str, Meta(min_length=1, max_length=MAX_NAME)]
    count = Annotated[int, Meta(ge=0)]
    request_id = Annotated[str, Meta(max_length=MAX_ID)]
    rows = Annotated[int, Meta(ge=0, le=MAX_ROWS)]
    timings = Annotated[dict[Annotated[str, Meta(max_length=64)], float], Meta(max_length=8)]
    return name, count, request_id, rows, timings


def _chunk_struct() -> type:
    """TokenChunk as a msgspec Struct, the wire keys its fields."""
    import msgspec

    Name, Count, Id, Rows, Timings = _bounded_types()

    class Chunk(msgspec.Struct, tag="tokens", tag_field="t", frozen=True):
        v: int
        id: Id
        m: Name
        s: Count
        rows: Rows
        ids: np.ndarray
        cu: np.ndarray
        dl: float
        o: dict[str, Any] = {}
        tm: Timings = {}

        def __post_init__(self) -> None:
            cu = self.cu
            if len(cu) < 2 or cu[0] != 0 or cu[-1] != len(self.ids) or np.any(np.diff(cu.astype(np.int64)) <= 0):
                raise ProtocolError("cu_seqlens must start at 0, increase strictly and end at len(ids)")
            if self.s + len(cu) - 1 > self.rows:
                raise ProtocolError("rows out of range")
            _finite(self.dl, "deadline")
            _finite_timings(self.tm)
            EmbedOptions.from_wire(self.o)

    return Chunk


def _result_struct() -> type:
    """EmbedResult as a msgspec Struct, the wire keys its fields."""
    import msgspec
    from msgspec import Meta

    _, Count, Id, Rows, Timings = _bounded_types()

    class Result(msgspec.Struct, tag="result", tag_field="t", frozen=True):
        v: int
        id: Id
        s: Count
        rows: Rows
        dim: Annotated[int, Meta(gt=0, le=1 << 20)]
        dt: str
        vec: bytes
        tok: Count
        tm: Timings = {}

        def __post_init__(self) -> None:
            size = self.dim * 4  # this benchmark's dtype: f4
            if self.dt != "f4" or not self.vec or len(self.vec) % size:
                raise ProtocolError("payload is not a whole number of rows")
            if self.s + len(self.vec) // size > self.rows:
                raise ProtocolError("rows out of range")
            _finite_timings(self.tm)

    return Result


def _job_struct() -> type:
    """JobBatch as a msgspec Struct, the wire keys its fields."""
    import msgspec
    from msgspec import Meta

    Name, Count, _, _, _ = _bounded_types()

    class Job(msgspec.Struct, tag="job", tag_field="t", frozen=True):
        v: int
        jb: Name
        bi: Count
        m: Name
        di: Annotated[list[str], Meta(max_length=MAX_ROWS)]
        x: Annotated[list[str], Meta(max_length=MAX_ROWS)]
        o: dict[str, Any] = {}

        def __post_init__(self) -> None:
            if len(self.di) != len(self.x) or not self.x:
                raise ProtocolError("a job batch needs as many document ids as texts, and at least one")
            EmbedOptions.from_wire(self.o)

    return Job


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return np.ascontiguousarray(obj, dtype="<i4").tobytes()
    raise NotImplementedError(type(obj))  # msgspec's way of being told a type is not ours to encode


def _dec_hook(kind: type, obj: Any) -> Any:
    if kind is np.ndarray and isinstance(obj, bytes) and len(obj) % 4 == 0:
        return np.frombuffer(obj, dtype="<i4")
    raise ProtocolError("an int32 array must be whole int32 values")


def msgspec_codecs() -> dict[str, Callable[[Any], Callable[[], object]]]:
    """Per message, a function from the message to one encode-and-decode round through msgspec Structs
    that check what the codec checks (types, sizes, array invariants)."""
    import msgspec

    Chunk, Result, Job = _chunk_struct(), _result_struct(), _job_struct()
    encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
    decoder = msgspec.msgpack.Decoder(Chunk | Result | Job, dec_hook=_dec_hook)

    def chunk(msg: TokenChunk) -> Callable[[], object]:
        return lambda: decoder.decode(
            encoder.encode(
                Chunk(
                    2,
                    msg.id,
                    msg.model,
                    msg.start,
                    msg.total,
                    msg.input_ids,
                    msg.cu_seqlens,
                    msg.deadline,
                    msg.options.to_wire(),
                    msg.timings,
                )
            )
        )

    def result(msg: EmbedResult) -> Callable[[], object]:
        return lambda: decoder.decode(
            encoder.encode(
                Result(2, msg.id, msg.start, msg.total, msg.dim, msg.dtype, msg.data, msg.tokens, msg.timings)
            )
        )

    def job(msg: JobBatch) -> Callable[[], object]:
        return lambda: decoder.decode(
            encoder.encode(Job(2, msg.id, msg.batch, msg.model, msg.doc_ids, msg.texts, msg.options.to_wire()))
        )

    return {"TokenChunk 32x128": chunk, "EmbedResult 32x384 f4": result, "JobBatch 64 texts": job}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=2000, help="calls a round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds, of which the best counts")
    args = parser.parse_args()
    try:
        others = msgspec_codecs()
    except ImportError:
        others = {}
        print("msgspec is not installed: the codec alone")
    print(f"{'message':<24}{'bytes':>8}{'codec µs':>11}{'msgspec µs':>12}{'codec/msgspec':>15}")
    for name, msg in messages().items():
        data = encode(msg)
        ours = timed(lambda msg=msg: decode_as(encode(msg), type(msg)), args.rounds, args.number)
        line = f"{name:<24}{len(data):>8}{ours:>11.1f}"
        if name in others:
            theirs = timed(others[name](msg), args.rounds, args.number)
            line += f"{theirs:>12.1f}{ours / theirs:>15.2f}"
        print(line)


if __name__ == "__main__":
    main()
