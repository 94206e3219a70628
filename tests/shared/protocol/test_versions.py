"""Protocol versions: every message says the version of its key layout; this release writes and reads
VERSION alone, and refuses any other saying what it reads (and, for a newer one, what to do)."""

import msgpack
import pytest

from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.protocol import VERSION, ErrorReply, JobBatch, ProtocolError, decode, encode

BODY = {"t": "job", "jb": "job1", "bi": 3, "m": "m", "di": ["d0", "d1"], "x": ["one", "two"], "o": {"dt": "f4"}}


def test_the_version_is_written_and_read():
    raw = msgpack.unpackb(encode(JobBatch("job1", 3, "m", ["d0"], ["one"])))
    assert raw["v"] == VERSION == 2
    assert isinstance(decode(msgpack.packb({"v": VERSION, **BODY})), JobBatch)


@pytest.mark.parametrize("version, advice", [(3, "; upgrade it to the sender's release"), (1, ""), (0, ""), (-1, "")])
def test_other_versions_are_refused_saying_what_is_read(version, advice):
    with pytest.raises(ProtocolError) as refused:
        decode(msgpack.packb({**BODY, "v": version}))
    assert str(refused.value) == f"unsupported protocol version {version}: this service reads v{VERSION}{advice}"


def test_error_reply_names_the_row_that_failed():
    plain = ErrorReply("a", ErrorCode.INVALID_REQUEST, "too long")
    assert "row" not in msgpack.unpackb(encode(plain)) and decode(encode(plain)).row is None
    rowed = ErrorReply("a", ErrorCode.INVALID_REQUEST, "too long", row=3)
    assert msgpack.unpackb(encode(rowed))["row"] == 3 and decode(encode(rowed)) == rowed
    body = msgpack.unpackb(encode(rowed))
    for bad in (-1, True, "3", 1.5):
        with pytest.raises(ProtocolError, match="'row'"):
            decode(msgpack.packb({**body, "row": bad}))
