"""Did a request's token batches reach a worker? Asked of nats-server, which knows at once.

A batch published to a subject nobody subscribes to is dropped without a word: a worker killed a
moment ago (its load reports not stale yet, so the router still picks it), or no worker at all. So
after publishing a group of requests' batches, the tokenizer sends one empty message on each subject they went
to, with a reply to its own inbox (and the DELIVERY_CHECK header). Messages of one connection are handled in order: where the batches
found nobody, so does the check, and nats-server answers it with a 503 status at once. A worker
ignores the check; where it arrived, nothing comes back. What was sent is
kept ``KEEP`` seconds for a 503 to name it.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from embedfleet.shared.nats.bundles import Item, pack, publish
from embedfleet.shared.protocol import DELIVERY_CHECK

log = logging.getLogger("embedfleet.tokenizer")

KEEP = 5.0  # seconds: a 503 comes within a round trip; this outlasts a busy event loop many times over
_NO_RESPONDERS = "503"


@dataclass(frozen=True, slots=True)
class Sent:
    """Token batches of one request published on one subject."""

    subject: str
    payloads: tuple[bytes, ...]
    tokens: int  # in all of them (the router's measure of load)
    reply: str  # the requester's reply subject
    headers: dict[str, str] | None
    request_id: str
    model: str
    replies: bool = False  # the requester reads Replies: its batches may go in a Requests with others'
    carrier: str = ""  # the reply subject this process may answer the requester on (shared/nats/bundles.py)
    tries: int = 1  # subjects tried so far for these batches
    avoid: tuple[str, ...] = ()  # workers the request asked to pass over (EmbedRequest.avoid)


class DeliveryCheck:
    """``on_missed(sent)`` is called for batches that reached nobody."""

    def __init__(self, nc: Client, on_missed: Callable[[Sent], Awaitable[None]]) -> None:
        self._nc = nc
        self._on_missed = on_missed
        self._inbox = ""
        self._sub: Subscription | None = None
        self._count = 0
        self._kept: OrderedDict[int, tuple[float, list[Sent]]] = OrderedDict()  # check number -> (sent at, batches)

    async def start(self) -> None:
        self._inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_answer)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        self._kept.clear()

    async def publish(self, sents: list[Sent]) -> None:
        """Publish ``sents``' batches, those for one subject and one requester as one Requests message
        where the requester reads Replies (shared/nats/bundles.py), then check once per subject that they
        reached someone (a group of requests gets one check a subject, not one a request)."""
        by_subject: dict[str, list[Sent]] = {}
        for sent in sents:
            by_subject.setdefault(sent.subject, []).append(sent)
        for subject, on_subject in by_subject.items():
            by_requester: dict[tuple[bool, str], list[Item]] = {}
            for sent in on_subject:
                # a requester of Replies: its inbox (all but the last token); any other: each batch alone
                inbox = sent.reply.rpartition(".")[0] if sent.replies else ""
                by_requester.setdefault((bool(inbox), inbox or sent.reply), []).extend(
                    Item(sent.reply, payload, sent.headers) for payload in sent.payloads
                )
            for (together, _), items in by_requester.items():
                for group in pack(items, self._nc.max_payload) if together else [[item] for item in items]:
                    await publish(self._nc, subject, group)
        now = time.monotonic()
        while self._kept and now - next(iter(self._kept.values()))[0] > KEEP:
            self._kept.popitem(last=False)
        for subject, on_subject in by_subject.items():
            self._count += 1
            self._kept[self._count] = (now, on_subject)
            await self._nc.publish(subject, b"", reply=f"{self._inbox}.{self._count}", headers={DELIVERY_CHECK: "1"})

    async def _on_answer(self, msg: Msg) -> None:
        if not (msg.headers and msg.headers.get("Status") == _NO_RESPONDERS):
            return
        try:
            _, sents = self._kept.pop(int(msg.subject.rsplit(".", 1)[-1]))
        except (KeyError, ValueError):
            return  # kept no longer
        for sent in sents:
            try:
                await self._on_missed(sent)
            except Exception:  # the connection went away meanwhile: the requester's own checks take over
                log.exception("request %s: handling batches that reached no worker failed", sent.request_id)
