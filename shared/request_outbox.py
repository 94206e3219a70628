"""Embed requests published in one pass of the event loop go to the tokenizers as one message.

A gateway handles many HTTP requests in one pass of its loop (the server reads every connection that
has data, and each handler runs to its first real wait). Published one by one, each request is a NATS
message that every hop pays for: nats-server routes it, the tokenizer's client parses it and calls
back. ``Outbox.add`` only queues a request and, for the first of a pass, schedules the flush; the
flush, which runs once the pass is over, publishes what is queued for a subject as one Requests
message (shared/protocol), or a lone request as itself. No timer: a request waits for no other, only
for the end of the pass it was made in, as nats-py's own writes do.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Callable

from nats.aio.client import Client

from shared.protocol import MAX_BUNDLE, Requests, encode
from shared.tracing import TRACEPARENT

log = logging.getLogger("embedfleet.client")

_OVERHEAD = 64  # a Requests message's bytes besides its entries (map, keys, type, version)
_PER_ENTRY = 16  # msgpack's headers of one entry's subject, trace and message


@dataclass(frozen=True, slots=True)
class Outgoing:
    reply: str  # the request's reply subject
    payload: bytes  # its encoded EmbedRequest
    headers: dict[str, str] | None  # what it would carry alone (its traceparent)


class Outbox:
    """``add`` queues a request for ``subject``; the pass's flush publishes them. ``carried(reply, replies)``
    is told, for each bundle, the reply subject it went with and those of every request in it (the
    no-responders answer of nats-server comes on the first only). ``failed(replies, exc)``: a publish
    that raised (the connection went away meanwhile)."""

    def __init__(self, nc: Client, carried: Callable[[str, list[str]], None],
                 failed: Callable[[list[str], Exception], None]) -> None:
        self._nc = nc
        self._carried = carried
        self._failed = failed
        self._queued: dict[str, list[Outgoing]] = {}
        self._scheduled = False

    def add(self, subject: str, item: Outgoing) -> None:
        self._queued.setdefault(subject, []).append(item)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        queued, self._queued = self._queued, {}
        self._scheduled = False
        for subject, items in queued.items():
            for bundle in _bundles(items, self._nc.max_payload):
                replies = [item.reply for item in bundle]
                try:
                    if len(bundle) == 1:
                        await self._nc.publish(subject, bundle[0].payload, reply=bundle[0].reply, headers=bundle[0].headers)
                    else:
                        self._carried(bundle[0].reply, replies)
                        message = Requests(replies, [(item.headers or {}).get(TRACEPARENT, "") for item in bundle],
                                           [item.payload for item in bundle])
                        await self._nc.publish(subject, encode(message), reply=bundle[0].reply)
                except Exception as exc:  # the connection went away since the requests were made
                    log.warning("publishing %d requests on %s failed: %s", len(bundle), subject, exc)
                    self._failed(replies, exc)


def _bundles(items: list[Outgoing], max_payload: int) -> list[list[Outgoing]]:
    """``items`` in order, cut into groups whose Requests message fits ``max_payload`` (each item fits
    alone: the client checked it), at most MAX_BUNDLE each."""
    out: list[list[Outgoing]] = []
    group: list[Outgoing] = []
    size = _OVERHEAD
    for item in items:
        cost = len(item.payload) + len(item.reply) + len(TRACEPARENT) + 64 + _PER_ENTRY
        if group and (size + cost > max_payload or len(group) >= MAX_BUNDLE):
            out.append(group)
            group, size = [], _OVERHEAD
        group.append(item)
        size += cost
    if group:
        out.append(group)
    return out
