"""ChunkRequest and ChunkLayout on the wire: they round trip, and a layout that does not hold together
is refused with a message that says why (tests/shared/protocol/test_fuzz.py throws the rest at them)."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.protocol import VERSION, ChunkLayout, ChunkRequest, ProtocolError, decode, decode_as, encode
from embedfleet.shared.text_chunks import ChunkSpec, TextChunk

CHUNKS = [[TextChunk(0, 5, 0, 2), TextChunk(4, 9, 1, 3)], [TextChunk(0, 0, 0, 0)], [TextChunk(2, 7, 0, 4)]]
TOKENS = [3, 0, 4]


def _layout(**arrays: list[int]) -> bytes:
    body = msgpack.unpackb(encode(ChunkLayout.of("r", CHUNKS, TOKENS)))
    return msgpack.packb({**body, **{k: np.array(v, "<i4").tobytes() for k, v in arrays.items()}}, use_bin_type=True)


def _request(**fields) -> bytes:
    body = {"v": VERSION, "t": "chunk", "id": "r", "m": "m", "x": ["a"], "sz": 8, "ov": 2, "bd": "token"}
    return msgpack.packb(body | fields, use_bin_type=True)


def test_a_chunk_request_round_trips():
    msg = ChunkRequest("r", "m", ["a long text", ""], ChunkSpec(128, 16, "sentence"), "query", "document")
    out = decode_as(encode(msg), ChunkRequest)
    assert out == msg
    assert out.prompt_options.prompt_name == "query" and out.prompt_options.input_type == "document"
    assert msgpack.unpackb(encode(msg)) == {
        "v": VERSION,
        "t": "chunk",
        "id": "r",
        "m": "m",
        "x": ["a long text", ""],
        "sz": 128,
        "ov": 16,
        "bd": "sentence",
        "pn": "query",
        "it": "document",
    }


def test_a_layout_round_trips_and_reads_back_as_each_inputs_chunks():
    layout = ChunkLayout.of("r", CHUNKS, TOKENS)
    assert layout.counts.tolist() == [2, 1, 1] and layout.tokens.tolist() == TOKENS
    assert layout.starts.dtype == np.dtype("<i4") and layout.starts.tolist() == [0, 4, 0, 2]
    out = decode_as(encode(layout), ChunkLayout)
    assert out.chunks() == CHUNKS
    assert [a.tolist() for a in (out.counts, out.tokens, out.starts, out.ends, out.firsts, out.lasts)] == [
        [2, 1, 1],
        [3, 0, 4],
        [0, 4, 0, 2],
        [5, 9, 0, 7],
        [0, 1, 0, 0],
        [2, 3, 0, 4],
    ]
    # the arrays travel as packed little-endian int32, one per key
    wire = msgpack.unpackb(encode(layout))
    assert wire["cs"] == np.array([0, 4, 0, 2], "<i4").tobytes() and wire["cc"] == np.array([2, 1, 1], "<i4").tobytes()


def test_an_empty_layout_round_trips():
    assert decode_as(encode(ChunkLayout.of("r", [], [])), ChunkLayout).chunks() == []


_COUNTS = "each input has at least one chunk, the counts summing to the chunks, and tokens >= 0"
_SPANS = "a chunk spans 0 <= start <= end characters and 0 <= first <= last <= its input's tokens"


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"cc": [2, 1]}, "a layout has one chunk count and one token count per input, at most 1048576 inputs"),
        ({"ct": [3, 0, 4, 1]}, "a layout has one chunk count and one token count per input, at most 1048576 inputs"),
        ({"cl": [2, 3, 0]}, "a layout has one start, end, first and last per chunk, at most 1048576 chunks"),
        ({"cs": [0, 4, 0, 2, 9]}, "a layout has one start, end, first and last per chunk, at most 1048576 chunks"),
        ({"cc": [2, 1, 2]}, _COUNTS),
        ({"cc": [2, 0, 1]}, _COUNTS),
        ({"cc": [3, 1, 0]}, _COUNTS),
        ({"cc": [2**31 - 1, 2**31 - 1, 6]}, _COUNTS),  # summed in int64: no wrap-around to the chunk count
        ({"ct": [3, -1, 4]}, _COUNTS),
        ({"cs": [0, 10, 0, 2]}, _SPANS),
        ({"cs": [-1, 4, 0, 2], "ce": [-1, 9, 0, 7]}, _SPANS),
        ({"cf": [0, 4, 0, 0]}, _SPANS),
        ({"cf": [-2, 1, 0, 0]}, _SPANS),
        ({"cl": [2, 3, 0, 5]}, _SPANS),  # past its input's 4 tokens
        ({"cl": [2, 3, 1, 4]}, _SPANS),  # a text of no tokens has none to span
    ],
)
def test_a_layout_that_does_not_hold_together_is_refused(arrays, message):
    with pytest.raises(ProtocolError) as err:
        decode(_layout(**arrays))
    assert str(err.value) == message


def test_layout_arrays_must_be_whole_int32_bytes():
    body = msgpack.unpackb(_layout())
    with pytest.raises(ProtocolError, match=r"^counts is not a whole number of int32 values$"):
        decode(msgpack.packb({**body, "cc": b"\x01\x00\x00"}))
    with pytest.raises(ProtocolError, match=r"^field 'ce' must be bytes$"):
        decode(msgpack.packb({**body, "ce": [5, 9, 0, 7]}))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"sz": 0}, "chunking.size must be an integer of at least 1, got 0"),
        ({"sz": None}, "chunking.size must be an integer of at least 1, got None"),
        ({"sz": 8.0}, "chunking.size must be an integer of at least 1, got 8.0"),
        ({"ov": 8}, "chunking.overlap (8) must be less than chunking.size (8)"),
        ({"ov": -1}, "chunking.overlap must be an integer of at least 0, got -1"),
        ({"bd": "paragraph"}, "chunking.boundary must be 'token' or 'sentence', got 'paragraph'"),
        (
            {"bd": "x" * 100_000},
            "chunking.boundary must be 'token' or 'sentence', got 'xxxxxxxxxxxxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxxxxxxxxxxxx'",
        ),
        ({"pn": 7}, "options.prompt_name must be a short string"),
        ({"it": "q" * 300}, "options.input_type must be a short string"),
        ({"x": "one text"}, "field 'x' must be list"),
        ({"m": ""}, "field 'm' must not be empty"),
    ],
)
def test_a_chunk_request_is_checked_as_chunk_spec_checks_a_clients(fields, message):
    """The wire's checks are ChunkSpec's (the one place chunking parameters are checked), in its words."""
    with pytest.raises(ProtocolError) as err:
        decode(_request(**fields))
    assert str(err.value) == message


def test_chunk_spec_quotes_a_long_value_shortly():
    with pytest.raises(ServiceError) as err:
        ChunkSpec(8, 0, "y" * 10_000)
    assert err.value.code is ErrorCode.INVALID_REQUEST and len(err.value.message) < 120
