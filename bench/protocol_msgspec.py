"""msgspec Structs for the hot messages, checking what shared/protocol's codec checks, for bench.protocol.

Wire keys are the field names; types and bounds are msgspec's (``Meta``), the array invariants are in
``__post_init__`` and int32 arrays go through ``enc_hook`` / ``dec_hook``. Importing this module needs
msgspec (pip install msgspec); bench.protocol runs the codec alone without it.
"""

import math
from collections.abc import Callable
from typing import Annotated, Any

import msgspec
import numpy as np
from msgspec import Meta

from embedfleet.shared.protocol import (
    MAX_ID,
    MAX_NAME,
    MAX_ROWS,
    EmbedOptions,
    EmbedResult,
    JobBatch,
    ProtocolError,
    TokenChunk,
)


def _finite(value: float, what: str) -> None:
    if not math.isfinite(value):
        raise ProtocolError(f"{what} must be finite")


def _finite_timings(timings: dict[str, float]) -> None:
    for seconds in timings.values():
        _finite(seconds, "timings")


# msgspec's annotations for the codec's bounds, as type aliases so a checker reads them as types too
Name = Annotated[str, Meta(min_length=1, max_length=MAX_NAME)]
Count = Annotated[int, Meta(ge=0)]
Id = Annotated[str, Meta(max_length=MAX_ID)]
Rows = Annotated[int, Meta(ge=0, le=MAX_ROWS)]
Timings = Annotated[dict[Annotated[str, Meta(max_length=64)], float], Meta(max_length=8)]


class Chunk(msgspec.Struct, tag="tokens", tag_field="t", frozen=True):
    """TokenChunk as a msgspec Struct, the wire keys its fields."""

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


class Result(msgspec.Struct, tag="result", tag_field="t", frozen=True):
    """EmbedResult as a msgspec Struct, the wire keys its fields."""

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


class Job(msgspec.Struct, tag="job", tag_field="t", frozen=True):
    """JobBatch as a msgspec Struct, the wire keys its fields."""

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
