"""The row an error reply names: on the wire, and from a part's numbering to the request's."""

from __future__ import annotations

import asyncio

import msgpack
import numpy as np
import pytest

from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.nats.embed_client import part_of, reply_error
from embedfleet.shared.protocol import ErrorReply, ProtocolError, decode, encode


def test_the_row_travels_and_is_left_out_when_none():
    reply = ErrorReply("a", ErrorCode.INPUT_TOO_LONG, "has 300 tokens", row=7)
    body = msgpack.unpackb(encode(reply))
    assert body["row"] == 7 and decode(encode(reply)) == reply
    plain = ErrorReply("a", ErrorCode.TIMEOUT, "late")
    assert "row" not in msgpack.unpackb(encode(plain)) and decode(encode(plain)).row is None


@pytest.mark.parametrize("row", [-1, "3", 1.5, True, None])
def test_a_row_is_a_non_negative_integer(row):
    body = msgpack.unpackb(encode(ErrorReply("a", ErrorCode.INVALID_TOKENS, "has no tokens", row=0)))
    body["row"] = row
    with pytest.raises(ProtocolError, match="'row'"):
        decode(msgpack.packb(body))


def test_an_inputs_error_names_it_by_its_row():
    error = ServiceError(ErrorCode.INVALID_TOKENS, "has no tokens", 2)
    assert (error.text(), str(error)) == ("input 2 has no tokens", "input 2 has no tokens")
    assert error.text("the query") == "the query has no tokens"
    moved = error.at(12, "candidate")
    assert (moved.code, moved.row, moved.text()) == (ErrorCode.INVALID_TOKENS, 12, "candidate 12 has no tokens")
    assert ServiceError(ErrorCode.TIMEOUT, "late").text("the query") == "late"


def test_a_reply_row_is_mapped_to_the_request_and_checked():
    reply = ErrorReply("a", ErrorCode.INPUT_TOO_LONG, "has 300 tokens", row=1)
    assert reply_error(reply, 3).text() == "input 1 has 300 tokens"
    # a resent attempt holds rows 4, 9 and 11 of the request: its row 1 is the request's 9
    resent = reply_error(reply, 3, np.array([4, 9, 11]))
    assert (resent.row, resent.text()) == (9, "input 9 has 300 tokens")
    assert reply_error(reply, 3, noun="candidate").text() == "candidate 1 has 300 tokens"
    with pytest.raises(ProtocolError, match="outside a request of 1"):
        reply_error(reply, 1)  # untrusted: a row the request does not have
    assert reply_error(ErrorReply("a", ErrorCode.TIMEOUT, "late"), 1).row is None


def test_a_parts_error_is_said_of_the_requests_row():
    async def failing(error: ServiceError):
        raise error

    async def run(error: ServiceError, rows, noun="input"):
        with pytest.raises(ServiceError) as err:
            await part_of(failing(error), rows, noun)
        return err.value

    row_error = ServiceError(ErrorCode.INVALID_TOKENS, "has no tokens", 1)
    got = asyncio.run(run(row_error, range(32, 64), "candidate"))
    assert (got.row, got.text()) == (33, "candidate 33 has no tokens")
    assert asyncio.run(run(row_error, [3, 5])).text() == "input 5 has no tokens"
    plain = ServiceError(ErrorCode.TIMEOUT, "late")
    assert asyncio.run(run(plain, [3])) is plain
