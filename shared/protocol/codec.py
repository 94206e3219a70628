"""Protocol codec: a message framed as a msgpack map with its version and type, and decoding that checks
every field before use; each message's keys are in shared/protocol/wire.py (tabled in docs/protocol.md)."""

from __future__ import annotations

from typing import TypeVar, Union

import msgpack

from shared.errors import ServiceError
from shared.protocol.checks import ProtocolError, _is_int, _show
from shared.protocol.messages import (
    VERSION, ChunkLayout, ChunkRequest, DecodeRequest, DecodeResult, EmbedRequest, EmbedResult, ErrorReply, Held, JobBatch, JobResult, LoadReport,
    Replies, Requests, RerankRequest, RerankResult, TokenChunk, TokenizeRequest, TokenizeResult,
)
from shared.protocol.wire import FORMS


Message = Union[
    EmbedRequest, TokenChunk, EmbedResult, ErrorReply, Held, TokenizeRequest, TokenizeResult, DecodeRequest, DecodeResult,
    LoadReport, JobBatch, JobResult, RerankRequest, RerankResult, Replies, Requests, ChunkRequest, ChunkLayout,
]


def encode(msg: Message) -> bytes:
    """Serialise one message to msgpack bytes (its keys: docs/protocol.md), in the version
    ``write_version`` chose (this release's own unless told otherwise)."""
    form = FORMS.get(getattr(msg, "TYPE", None))
    if form is None:  # pragma: no cover - internal misuse
        raise TypeError(f"not a protocol message: {type(msg).__name__}")
    body = form[0](msg)
    if _written == 1:
        body = _as_v1(msg, body)
    return msgpack.packb({"v": _written, "t": msg.TYPE} | body, use_bin_type=True)


def _as_v1(msg: Message, body: dict) -> dict:
    """``body`` as the release that writes v1 wrote it. An input's error names the input in its text
    (v1 readers know no ``row``)."""
    if isinstance(msg, ErrorReply) and msg.row is not None:
        body = {k: v for k, v in body.items() if k != "row"}
        body["e"] = ServiceError(msg.code, msg.message, msg.row).text()
    renamed = V2_TO_V1.get(msg.TYPE)
    return {renamed.get(k, k): v for k, v in body.items()} if renamed else body


def write_version(version: int) -> None:
    """Write ``version`` from now on. Version 1 is for a rolling upgrade: while services of the
    release before still run, the new ones write what those read (and read both); once every service
    is upgraded, they go back to the default."""
    global _written
    if version not in READ_VERSIONS:
        raise ValueError(f"protocol version {version}: this service writes v1 or v{VERSION}")
    _written = version


# per message type, v1's key -> v2's, for the keys v1 spells otherwise (v2 gives no key two meanings).
# JetStream keeps v1 job batches, bulk token chunks and job results across an upgrade: a v1 message is
# read with these keys mapped first, then checked exactly as a v2 one.
V1_KEYS: dict[str, dict[str, str]] = {
    "tokens": {"n": "rows"},
    "result": {"n": "rows", "b": "vec"},
    "tokenized": {"tk": "tkd"},
    "job": {"id": "jb", "b": "bi"},
    "jobresult": {"id": "jb", "b": "bi", "d": "vec"},
    "load": {"id": "wk", "s": "sub", "q": "qt", "i": "iv"},
    "ranked": {"i": "ci"},
}
V2_TO_V1 = {kind: {new: old for old, new in keys.items()} for kind, keys in V1_KEYS.items()}
READ_VERSIONS = (1, VERSION)
_written = VERSION


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
    if not _is_int(version) or version not in READ_VERSIONS:
        newer = _is_int(version) and version > VERSION
        raise ProtocolError(
            f"unsupported protocol version {_show(version)}: this service reads v1 and v{VERSION}"
            + ("; upgrade it to the sender's release" if newer else "")
        )
    kind = m.get("t")
    form = FORMS.get(kind) if isinstance(kind, str) else None
    if form is None:
        raise ProtocolError(f"unknown message type {_show(kind)}")
    if version == 1 and kind in V1_KEYS:
        renamed = V1_KEYS[kind]
        m = {renamed.get(k, k): v for k, v in m.items() if k not in renamed.values()}
    return form[1](m)


M = TypeVar(
    "M", EmbedRequest, TokenChunk, EmbedResult, ErrorReply, Held, TokenizeRequest, TokenizeResult, DecodeRequest, DecodeResult,
    LoadReport, JobBatch, JobResult, RerankRequest, RerankResult, Replies, Requests, ChunkRequest, ChunkLayout,
)


def decode_as(data: bytes, kind: type[M]) -> M:
    """Decode a message that must be of type ``kind``; ProtocolError otherwise."""
    msg = decode(data)
    if not isinstance(msg, kind):
        raise ProtocolError(f"expected a {kind.TYPE!r} message, got {msg.TYPE!r}")
    return msg
