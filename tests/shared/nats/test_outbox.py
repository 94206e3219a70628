"""Embed requests made in one pass of the event loop go as one Requests message, against a real
nats-server: a lone one as itself, several as one message on the first's reply subject, cut to fit
the server's max_payload; and a tokenizer takes such a message apart, checking it."""

from __future__ import annotations

import asyncio

import nats
import pytest

from embedfleet.shared.nats.bundles import Entry, Item, carrier_of, is_bundle, unbundle
from embedfleet.shared.nats.outbox import Outbox
from embedfleet.shared.protocol import ProtocolError, Requests, decode, encode

INBOX = "_INBOX.test.abc"


def _requests(got: list) -> int:
    return sum(len(decode(m.data).subjects) if is_bundle(m.data) else 1 for m in got)


async def _published(nats_url: str, make, count: int) -> tuple[list, list]:
    """What arrives on subject 'e' while ``make(outbox)`` runs, until ``count`` requests came, and what
    the outbox said it carried."""
    nc = await nats.connect(nats_url)
    got: list = []
    carried: list = []

    async def take(msg) -> None:
        got.append(msg)

    sub = await nc.subscribe("e", cb=take)
    outbox = Outbox(nc, lambda reply, replies: carried.append((reply, replies)), lambda replies, exc: None)
    await make(outbox, nc)
    await asyncio.sleep(0)  # the flush
    await nc.flush()
    for _ in range(300):
        if _requests(got) >= count:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)  # nothing more comes
    await sub.unsubscribe()
    await nc.close()
    return got, carried


def test_requests_of_one_pass_go_as_one_message_and_a_lone_one_as_itself(nats_url):
    async def one_pass(outbox, nc):
        for i in range(5):
            trace = {"traceparent": f"00-{'1' * 32}-{'2' * 16}-0{i % 2}"} if i else None
            outbox.add("e", Item(f"{INBOX}.{i}", f"request {i}".encode(), trace))
        await asyncio.sleep(0.05)  # the flush runs once the pass is over
        outbox.add("e", Item(f"{INBOX}.9", b"alone", None))

    got, carried = asyncio.run(_published(nats_url, one_pass, 6))
    assert len(got) == 2
    bundle = decode(got[0].data)
    assert isinstance(bundle, Requests) and got[0].reply == f"{INBOX}.0"
    assert bundle.subjects == [f"{INBOX}.{i}" for i in range(5)]
    assert bundle.messages == [f"request {i}".encode() for i in range(5)]
    assert bundle.traces[0] == "" and bundle.traces[3].endswith("-01")
    assert carried == [(f"{INBOX}.0", bundle.subjects)]
    assert got[1].data == b"alone" and got[1].reply == f"{INBOX}.9"


def test_a_pass_past_max_payload_goes_as_several_messages_each_within_it(nats_url):
    limit: list[int] = []

    async def big_pass(outbox, nc):
        limit.append(nc.max_payload)
        for i in range(40):
            outbox.add("e", Item(f"{INBOX}.{i}", bytes(nc.max_payload // 8), None))

    got, _ = asyncio.run(_published(nats_url, big_pass, 40))
    assert len(got) >= 6 and all(len(m.data) <= limit[0] for m in got)
    subjects = [s for m in got for s in (decode(m.data).subjects if is_bundle(m.data) else [m.reply])]
    assert subjects == [f"{INBOX}.{i}" for i in range(40)]


class _Msg:
    def __init__(self, data: bytes, reply: str) -> None:
        self.subject, self.data, self.reply, self.headers = "e", data, reply, None


def test_a_tokenizer_takes_a_bundle_apart_and_refuses_a_forged_one():
    data = encode(Requests([f"{INBOX}.1", f"{INBOX}.2"], ["", f"00-{'1' * 32}-{'2' * 16}-01"], [b"a", b"b"]))
    entries = unbundle(_Msg(data, f"{INBOX}.1"))
    assert entries == [
        Entry("e", f"{INBOX}.1", b"a", None, f"{INBOX}.1"),
        Entry("e", f"{INBOX}.2", b"b", {"traceparent": f"00-{'1' * 32}-{'2' * 16}-01"}, f"{INBOX}.1"),
    ]
    assert carrier_of(entries[1]) == f"{INBOX}.1" and carrier_of(_Msg(b"", "r")) == "r"
    assert not is_bundle(encode(Requests([f"{INBOX}.1"], [""], [b"a"]))[:4])
    with pytest.raises(ProtocolError, match="first entry's reply subject"):
        unbundle(_Msg(data, f"{INBOX}.2"))
    with pytest.raises(ProtocolError, match="share one inbox"):
        decode(encode(Requests([f"{INBOX}.1", "_INBOX.other.2"], ["", ""], [b"a", b"b"])))
    with pytest.raises(ProtocolError, match="1 to 1024"):
        decode(encode(Requests([], [], [])))
