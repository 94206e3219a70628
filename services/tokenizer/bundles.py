"""A Requests message (shared/protocol) taken apart: each embed request in it, as if it had come alone.

A gateway sends the embed requests it made in one pass of its loop as one message. Each entry becomes
an ``Entry`` that the tokenizer queues and handles like a message of its own (its reply subject, its
trace context in its headers); ``carrier`` keeps the reply subject of the message that brought it,
the only one this process may publish to for it (its NATS permissions), where its errors go inside a
Replies.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.aio.msg import Msg

from shared.protocol import ProtocolError, Requests, decode_as
from shared.tracing import TRACEPARENT

# how every Requests message begins: msgpack's map header, then "v": <version> and "t": "requests"
# (shared.protocol.codec writes the version and the type first); an EmbedRequest never does
_MARK = b"\xa1t\xa8requests"


@dataclass(frozen=True, slots=True)
class Entry:
    subject: str
    reply: str
    data: bytes
    headers: dict[str, str] | None
    carrier: str


def is_bundle(data: bytes) -> bool:
    return _MARK in data[:16]


def unbundle(msg: Msg) -> list[Entry]:
    """The entries of a Requests message (ProtocolError when it is malformed, or its reply subject is
    not its first entry's)."""
    bundle = decode_as(msg.data, Requests)
    if msg.reply != bundle.subjects[0]:
        raise ProtocolError("a Requests message must come with its first entry's reply subject")
    return [Entry(msg.subject, reply, data, {TRACEPARENT: trace} if trace else None, msg.reply)
            for reply, trace, data in zip(bundle.subjects, bundle.traces, bundle.messages)]


def carrier_of(msg: Msg | Entry) -> str:
    """The reply subject of the message that brought ``msg``: its own, unless it came in a Requests."""
    return msg.carrier if isinstance(msg, Entry) else (msg.reply or "")
