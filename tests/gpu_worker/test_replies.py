"""A batch's replies as messages: one Replies per requester that takes them, within max_payload."""

from embedfleet.services.gpu_worker.replies import Outgoing
from embedfleet.shared.protocol import EmbedResult, Replies, decode, encode


def _result(rid: str, rows: int = 1) -> bytes:
    return encode(EmbedResult(rid, 0, rows, 4, "f4", b"\0" * 16 * rows, 3))


def test_replies_to_one_requester_go_as_one_message_and_others_alone():
    out = Outgoing()
    for i in range(3):
        out.add(True, f"_INBOX.g.r{i}", _result(f"r{i}"))
    out.add(False, "_INBOX.g.x", _result("x"))  # from a requester of an earlier release: it reads no Replies
    out.add(True, "_INBOX.h.y", _result("y"))  # another requester's lone reply
    sent = dict(out.messages(1 << 20))
    assert set(sent) == {"_INBOX.g.r0", "_INBOX.g.x", "_INBOX.h.y"}  # the Replies on its first reply's subject
    bundle = decode(sent["_INBOX.g.r0"])
    assert isinstance(bundle, Replies) and bundle.subjects == ["_INBOX.g.r0", "_INBOX.g.r1", "_INBOX.g.r2"]
    assert [decode(m).id for m in bundle.messages] == ["r0", "r1", "r2"]
    assert decode(sent["_INBOX.g.x"]).id == "x" and decode(sent["_INBOX.h.y"]).id == "y"


def test_replies_are_split_to_fit_max_payload_and_each_message_fits():
    out = Outgoing()
    payloads = [_result(f"r{i}", rows=40) for i in range(10)]  # ~700 bytes each
    for i, payload in enumerate(payloads):
        out.add(True, f"_INBOX.g.r{i}", payload)
    limit = 2048
    sent = out.messages(limit)
    assert len(sent) > 1 and all(len(payload) <= limit for _, payload in sent)
    taken = []
    for subject, payload in sent:
        message = decode(payload)
        taken += message.messages if isinstance(message, Replies) else [payload]
        assert subject == (message.subjects[0] if isinstance(message, Replies) else f"_INBOX.g.{message.id}")
    assert taken == payloads  # every reply once, in order
    big = Outgoing()
    big.add(True, "_INBOX.g.big", _result("big", rows=200))  # alone over the limit: as itself
    assert big.messages(limit) == [("_INBOX.g.big", _result("big", rows=200))]


def test_replies_to_requests_that_came_in_one_message_go_on_that_message_s_subject():
    """A worker may publish only to the reply subject of a message it received: a request that came
    inside a Requests is answered on that message's subject (its carrier), inside a Replies."""
    out = Outgoing()
    out.add(True, "_INBOX.g.r1", _result("r1"), carrier="_INBOX.g.r0")
    out.add(True, "_INBOX.g.r2", _result("r2"), carrier="_INBOX.g.r0")
    out.add(False, "_INBOX.h.x", _result("x"), carrier="_INBOX.h.w")  # even where its requester asked for no Replies
    out.add(True, "_INBOX.k.z", _result("z"), carrier="_INBOX.k.z")  # its own carrier: as itself
    sent = dict(out.messages(1 << 20))
    assert set(sent) == {"_INBOX.g.r0", "_INBOX.h.w", "_INBOX.k.z"}
    bundle = decode(sent["_INBOX.g.r0"])
    assert isinstance(bundle, Replies) and bundle.subjects == ["_INBOX.g.r1", "_INBOX.g.r2"]
    alone = decode(sent["_INBOX.h.w"])
    assert isinstance(alone, Replies) and alone.subjects == ["_INBOX.h.x"] and decode(alone.messages[0]).id == "x"
    assert decode(sent["_INBOX.k.z"]).id == "z"
    split = Outgoing()
    for i in range(1, 4):
        split.add(True, f"_INBOX.g.r{i}", _result(f"r{i}", rows=40), carrier="_INBOX.g.r0")
    assert {subject for subject, _ in split.messages(1024)} == {"_INBOX.g.r0"}  # every part on the carrier
