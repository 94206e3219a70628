"""Protocol codec: a message framed as a msgpack map with its version and type, and decoding that checks
every field before use; each message's keys are in shared/protocol/wire.py (tabled in docs/protocol.md)."""

from __future__ import annotations

from typing import TypeVar

import msgpack

from embedfleet.shared.errors import shown
from embedfleet.shared.protocol.checks import ProtocolError, is_int
from embedfleet.shared.protocol.messages import (
    VERSION,
    Cancel,
    ChunkLayout,
    ChunkRequest,
    DecodeRequest,
    DecodeResult,
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
)
from embedfleet.shared.protocol.wire import CODECS

Message = (
    EmbedRequest
    | TokenChunk
    | EmbedResult
    | ErrorReply
    | Held
    | TokenizeRequest
    | TokenizeResult
    | DecodeRequest
    | DecodeResult
    | LoadReport
    | JobBatch
    | JobResult
    | RerankRequest
    | RerankResult
    | Replies
    | Requests
    | ChunkRequest
    | ChunkLayout
    | Cancel
)


def encode(msg: Message) -> bytes:
    """Serialise one message to msgpack bytes (its keys: docs/protocol.md)."""
    form = CODECS.get(getattr(msg, "TYPE", ""))
    if form is None:  # pragma: no cover - internal misuse
        raise TypeError(f"not a protocol message: {type(msg).__name__}")
    return msgpack.packb({"v": VERSION, "t": msg.TYPE} | form[0](msg), use_bin_type=True)


def decode(data: bytes) -> Message:
    """Parse and validate one message; raises ProtocolError on anything malformed."""
    try:
        # no length msgpack reads may exceed the message's own size, so a claimed length allocates
        # nothing the bytes do not back; nesting is bounded by msgpack's fixed parser stack
        limit = len(data)
        m = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_map_len=64,
            max_str_len=limit,
            max_bin_len=limit,
            max_array_len=limit,
            max_ext_len=limit,
        )
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"not a msgpack message: {str(exc)[:200]}") from None
    if not isinstance(m, dict):
        raise ProtocolError("message must be a msgpack map")
    version = m.get("v")
    if not is_int(version) or version != VERSION:
        newer = is_int(version) and version > VERSION
        raise ProtocolError(
            f"unsupported protocol version {shown(version)}: this service reads v{VERSION}"
            + ("; upgrade it to the sender's release" if newer else "")
        )
    kind = m.get("t")
    form = CODECS.get(kind) if isinstance(kind, str) else None
    if form is None:
        raise ProtocolError(f"unknown message type {shown(kind)}")
    return form[1](m)


M = TypeVar(
    "M",
    EmbedRequest,
    TokenChunk,
    EmbedResult,
    ErrorReply,
    Held,
    TokenizeRequest,
    TokenizeResult,
    DecodeRequest,
    DecodeResult,
    LoadReport,
    JobBatch,
    JobResult,
    RerankRequest,
    RerankResult,
    Replies,
    Requests,
    ChunkRequest,
    ChunkLayout,
    Cancel,
)


def decode_as(data: bytes, kind: type[M]) -> M:
    """Decode a message that must be of type ``kind``; ProtocolError otherwise."""
    msg = decode(data)
    if not isinstance(msg, kind):
        raise ProtocolError(f"expected a {kind.TYPE!r} message, got {msg.TYPE!r}")
    return msg
