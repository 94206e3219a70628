"""A sink job's sources (other fields, texts) as messages under the payload limit, and read back
only when every message is one (shared/jobs/sources.py)."""

import msgpack
import pytest

from embedfleet.shared.jobs.sink_writer import Sources
from embedfleet.shared.jobs.sources import _part, parts_of


def _joined(messages: list[bytes], limit: int) -> Sources:
    fields, texts = {}, {}
    for data in messages:
        part = _part(data, limit)
        fields.update(zip(part["ids"], part["fields"] or []))
        texts.update(zip(part["ids"], part["texts"] or []))
    return Sources(fields, texts)


def test_sources_are_cut_under_the_limit_and_come_back_whole():
    ids = [f"d{i}" for i in range(500)]
    sources = Sources({d: {"n": i, "tag": "x" * 30} for i, d in enumerate(ids)}, dict.fromkeys(ids, "text " * 40))
    messages = parts_of(ids, sources, 16_384)
    assert len(messages) > 5 and all(len(m) <= 16_384 for m in messages)
    assert [msgpack.unpackb(m)["part"] for m in messages] == list(range(len(messages)))
    assert _joined(messages, 16_384) == sources


def test_a_job_without_fields_or_texts_has_no_sources_and_one_too_large_is_refused():
    assert parts_of(["a"], Sources(None, None), 1024) == []
    with pytest.raises(ValueError, match="document 'a'"):
        parts_of(["a"], Sources(None, {"a": "y" * 5000}), 1024)


@pytest.mark.parametrize(
    "bad",
    [
        msgpack.packb([1, 2]),
        msgpack.packb({"part": 2, "parts": 2, "ids": []}),
        msgpack.packb({"part": 0, "parts": 1, "ids": [1]}),
        msgpack.packb({"part": 0, "parts": 1, "ids": ["a"], "fields": [{"x": 1}, None]}),
        msgpack.packb({"part": 0, "parts": 1, "ids": ["a"], "texts": [7]}),
        msgpack.packb({"part": 0, "parts": 1, "ids": ["a"], "texts": [b"bytes"]}, use_bin_type=True),
        b"\xc1",
        msgpack.packb({"part": 0, "parts": 1, "ids": ["a" * 5000]}),
    ],
)
def test_a_message_that_is_not_a_part_is_refused(bad):
    with pytest.raises(ValueError):  # msgpack's errors for a malformed message are ValueErrors too
        _part(bad, 4096)
