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
from collections.abc import Callable

from nats.aio.client import Client

from embedfleet.shared.nats.bundles import Item, pack, publish

log = logging.getLogger("embedfleet.client")


class Outbox:
    """``add`` queues a request for ``subject``; the pass's flush publishes them. ``carried(reply, replies)``
    is told, for each bundle, the reply subject it went with and those of every request in it (the
    no-responders answer of nats-server comes on the first only). ``failed(replies, exc)``: a publish
    that raised (the connection went away meanwhile)."""

    def __init__(
        self, nc: Client, carried: Callable[[str, list[str]], None], failed: Callable[[list[str], Exception], None]
    ) -> None:
        self._nc = nc
        self._carried = carried
        self._failed = failed
        self._queued: dict[str, list[Item]] = {}
        self._scheduled = False

    def add(self, subject: str, item: Item) -> None:
        self._queued.setdefault(subject, []).append(item)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        queued, self._queued = self._queued, {}
        self._scheduled = False
        for subject, items in queued.items():
            for bundle in pack(items, self._nc.max_payload):
                replies = [item.reply for item in bundle]
                try:
                    if len(bundle) > 1:
                        self._carried(bundle[0].reply, replies)
                    await publish(self._nc, subject, bundle)
                except Exception as exc:  # the connection went away since the requests were made
                    log.warning("publishing %d requests on %s failed: %s", len(bundle), subject, exc)
                    self._failed(replies, exc)
