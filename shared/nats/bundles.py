"""Several requests in one NATS message (a Requests, shared/protocol), both ways: packed, published, taken apart.

Two hops carry them: a gateway's embed requests of one loop pass go to a tokenizer as one message
(shared/nats/outbox.py), and a tokenizer's token chunks of one group go to a worker as one message
(services/tokenizer/delivery.py). Each request keeps its own reply subject and trace context; the
message goes with its first request's reply subject, the only one the receiver may publish to for all
of them (NATS ``allow_responses``): the receiver answers any other request of the message there,
inside a Replies. So a message packs only requests of one requester (reply subjects of one inbox).

The receiver takes a message apart into ``Entry``s, each handled as if it had come alone; ``carrier``
is the reply subject of the message that brought it.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg

from embedfleet.shared.observability.tracing import TRACEPARENT
from embedfleet.shared.protocol import MAX_BUNDLE, ProtocolError, Replies, Requests, decode_as, encode

_OVERHEAD = 64  # a Requests message's bytes besides its entries (map, keys, type, version)
_PER_ENTRY = 16  # msgpack's headers of one entry's subject, trace and message
_TRACE_BYTES = len(TRACEPARENT) + 64  # an entry's trace context, with room to spare

# how every Requests message begins: msgpack's map header, then "v": <version> and "t": "requests"
# (embedfleet.shared.protocol.codec writes the version and the type first); no other message does
_MARK = b"\xa1t\xa8requests"


@dataclass(frozen=True, slots=True)
class Item:
    """One request to send: what it would be as a message of its own."""

    reply: str  # its reply subject
    payload: bytes  # the encoded request
    headers: dict[str, str] | None  # what it would carry alone (its traceparent)


def pack(items: list[Item], max_payload: int) -> list[list[Item]]:
    """``items`` in order, cut into groups whose Requests message fits ``max_payload`` (each item fits
    alone: its sender checked it), at most MAX_BUNDLE each."""
    out: list[list[Item]] = []
    group: list[Item] = []
    size = _OVERHEAD
    for item in items:
        cost = len(item.payload) + len(item.reply) + _TRACE_BYTES + _PER_ENTRY
        if group and (size + cost > max_payload or len(group) >= MAX_BUNDLE):
            out.append(group)
            group, size = [], _OVERHEAD
        group.append(item)
        size += cost
    if group:
        out.append(group)
    return out


async def publish(nc: Client, subject: str, group: list[Item]) -> None:
    """``group`` (one of ``pack``'s, of one requester) on ``subject``: a lone item as itself, several as
    one Requests message with the first one's reply subject."""
    if len(group) == 1:
        await nc.publish(subject, group[0].payload, reply=group[0].reply, headers=group[0].headers)
        return
    message = Requests(
        [item.reply for item in group],
        [(item.headers or {}).get(TRACEPARENT, "") for item in group],
        [item.payload for item in group],
    )
    await nc.publish(subject, encode(message), reply=group[0].reply)


@dataclass(frozen=True, slots=True)
class Entry:
    """One request of a Requests message, handled as a message of its own."""

    subject: str
    reply: str
    data: bytes
    headers: dict[str, str] | None
    carrier: str  # the reply subject of the message that brought it


def is_bundle(data: bytes) -> bool:
    return _MARK in data[:16]


def unbundle(msg: Msg) -> list[Entry]:
    """The entries of a Requests message (ProtocolError when it is malformed, or its reply subject is
    not its first entry's)."""
    bundle = decode_as(msg.data, Requests)
    if msg.reply != bundle.subjects[0]:
        raise ProtocolError("a Requests message must come with its first entry's reply subject")
    return [
        Entry(msg.subject, reply, data, {TRACEPARENT: trace} if trace else None, msg.reply)
        for reply, trace, data in zip(bundle.subjects, bundle.traces, bundle.messages)
    ]


def carrier_of(msg: Msg | Entry) -> str:
    """The reply subject of the message that brought ``msg``: its own, unless it came in a Requests."""
    return msg.carrier if isinstance(msg, Entry) else (msg.reply or "")


def answer(reply: str, carrier: str, payload: bytes) -> tuple[str, bytes]:
    """How to send ``payload`` to ``reply`` when this process may publish only to ``carrier``: as itself
    when they are one subject, else inside a Replies on the carrier."""
    return (reply, payload) if reply == carrier else (carrier, encode(Replies([reply], [payload])))
