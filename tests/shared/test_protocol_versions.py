"""Protocol versions: v2 is written; v1, which JetStream keeps across an upgrade, is still read; a newer
version is refused with what to do. The v1 bodies below are what the v1 encoder wrote, key for key."""

import msgpack
import numpy as np
import pytest

from shared.errors import ErrorCode
from shared.protocol import (
    VERSION, EmbedOptions, EmbedResult, ErrorReply, JobBatch, JobResult, LoadReport, ProtocolError, RerankResult,
    TokenChunk, TokenizeResult, decode, encode,
)

IDS = np.array([101, 7, 102, 101, 102], "<i4")
CU = np.array([0, 3, 5], "<i4")
VECTORS = np.arange(4, dtype="<f4")
V1_OPTIONS = {"n": None, "d": 64, "dt": "f4", "tr": True, "td": "right", "pn": None, "it": "document"}
OPTIONS = EmbedOptions(dimensions=64, input_type="document")

V1_BODIES = [
    # stored in <prefix>_JOBS, <prefix>_BULK and <prefix>_RESULTS: a job half done when its fleet is upgraded
    ({"t": "job", "id": "job1", "b": 3, "m": "m", "di": ["d0", "d1"], "x": ["one", "two"], "o": V1_OPTIONS},
     JobBatch("job1", 3, "m", ["d0", "d1"], ["one", "two"], OPTIONS)),
    ({"t": "tokens", "id": "job1.3", "m": "m", "s": 0, "n": 2, "ids": IDS.tobytes(), "cu": CU.tobytes(), "dl": 1.5,
      "o": V1_OPTIONS, "tm": {}, "jb": "job1", "bi": 3, "di": ["d0", "d1"]},
     TokenChunk("job1.3", "m", 0, 2, IDS, CU, 1.5, OPTIONS, job="job1", batch=3, doc_ids=["d0", "d1"])),
    ({"t": "jobresult", "id": "job1", "b": 3, "s": 0, "di": ["d0", "d1"], "dim": 2, "dt": "f4", "d": VECTORS.tobytes(),
      "tok": 9},
     JobResult("job1", 3, 0, ["d0", "d1"], 2, "f4", VECTORS.tobytes(), 9)),
    # online messages, in flight while a fleet restarts
    ({"t": "result", "id": "r", "s": 0, "n": 2, "dim": 2, "dt": "f4", "b": VECTORS.tobytes(), "tok": 9, "tm": {}},
     EmbedResult("r", 0, 2, 2, "f4", VECTORS.tobytes(), 9)),
    ({"t": "load", "id": "w1", "m": "m", "s": "sub.w1", "q": 100, "i": 0.05, "l": False, "r": 10000.0},
     LoadReport("w1", "m", "sub.w1", 100, 0.05, False, 1e4)),
    ({"t": "tokenized", "id": "t", "tk": [[[101, "[CLS]", True, None, None], [7, "hi", False, 0, 2]]]},
     TokenizeResult("t", [[(101, "[CLS]", True, None, None), (7, "hi", False, 0, 2)]])),
    ({"t": "error", "id": "a", "c": "timeout", "e": "late"}, ErrorReply("a", ErrorCode.TIMEOUT, "late")),
]


def _same(a, b) -> bool:
    return encode(a) == encode(b)  # arrays compare by their bytes


@pytest.mark.parametrize("body, message", V1_BODIES, ids=[b["t"] for b, _ in V1_BODIES])
def test_v1_messages_are_read(body, message):
    decoded = decode(msgpack.packb({"v": 1, **body}, use_bin_type=True))
    assert type(decoded) is type(message) and _same(decoded, message)


def test_v1_rerank_result_is_read():
    body = {"v": 1, "t": "ranked", "id": "q", "i": np.array([1, 0], "<i4").tobytes(),
            "sc": np.array([0.5, 0.25], "<f4").tobytes()}
    got = decode(msgpack.packb(body))
    assert isinstance(got, RerankResult) and got.indices.tolist() == [1, 0] and got.scores.tolist() == [0.5, 0.25]


@pytest.mark.parametrize("body, message", V1_BODIES, ids=[b["t"] for b, _ in V1_BODIES])
def test_v2_is_written_with_one_meaning_a_key(body, message):
    raw = msgpack.unpackb(encode(message))
    assert raw["v"] == VERSION == 2
    renamed = {"job": ["id", "b"], "jobresult": ["id", "b", "d"], "result": ["n", "b"], "load": ["id", "s", "q", "i"],
               "tokens": ["n"], "tokenized": ["tk"]}
    assert not set(renamed.get(body["t"], ())) & set(raw)


def test_a_v1_message_with_v2_keys_reads_only_its_v1_keys():
    """A v1 body is read by its v1 keys alone: a v2 key beside them (hostile, or a bug) is dropped, not
    mixed in, so the message is exactly what its v1 fields say."""
    body, _ = V1_BODIES[0]
    got = decode(msgpack.packb({"v": 1, **body, "jb": "other", "bi": 9}))
    assert (got.id, got.batch) == ("job1", 3)


@pytest.mark.parametrize("version, advice", [(3, "; upgrade it to the sender's release"), (0, ""), (-1, "")])
def test_other_versions_are_refused_saying_what_is_read(version, advice):
    body, _ = V1_BODIES[0]
    with pytest.raises(ProtocolError) as refused:
        decode(msgpack.packb({**body, "v": version}))
    assert str(refused.value) == f"unsupported protocol version {version}: this service reads v1 and v2{advice}"


def test_error_reply_names_the_row_that_failed():
    plain = ErrorReply("a", ErrorCode.INVALID_REQUEST, "too long")
    assert "row" not in msgpack.unpackb(encode(plain)) and decode(encode(plain)).row is None
    rowed = ErrorReply("a", ErrorCode.INVALID_REQUEST, "too long", row=3)
    assert msgpack.unpackb(encode(rowed))["row"] == 3 and decode(encode(rowed)) == rowed
    body = msgpack.unpackb(encode(rowed))
    for bad in (-1, True, "3", 1.5):
        with pytest.raises(ProtocolError, match="'row'"):
            decode(msgpack.packb({**body, "row": bad}))


@pytest.fixture
def writing_v1():
    from shared.protocol.codec import write_version

    write_version(1)
    yield
    write_version(VERSION)


@pytest.mark.parametrize("body, message", V1_BODIES, ids=[b["t"] for b, _ in V1_BODIES])
def test_a_rolling_upgrade_writes_v1_as_the_release_before_did(writing_v1, body, message):
    assert msgpack.unpackb(encode(message)) == {"v": 1, **body}
    assert _same(decode(encode(message)), message)


def test_only_versions_it_reads_are_written():
    from shared.protocol.codec import write_version

    with pytest.raises(ValueError, match="writes v1 or v2"):
        write_version(3)
    assert msgpack.unpackb(encode(V1_BODIES[0][1]))["v"] == VERSION


def test_a_rolling_upgrade_names_the_failing_input_in_the_text(writing_v1):
    raw = msgpack.unpackb(encode(ErrorReply("a", ErrorCode.INPUT_TOO_LONG, "has 302 tokens; the limit is 256", row=3)))
    assert raw == {"v": 1, "t": "error", "id": "a", "c": "input_too_long", "e": "input 3 has 302 tokens; the limit is 256"}


@pytest.mark.parametrize("code", ["payload_too_large", "too_many_inputs", "route_not_found", "method_not_allowed"])
def test_the_gateways_own_codes_are_not_taken_from_the_wire(code):
    reply = decode(msgpack.packb({"v": VERSION, "t": "error", "id": "a", "c": code, "e": "x"}))
    assert reply.code is ErrorCode.INTERNAL
