"""A chunked job's rows on the wire (ChunkRows in TokenChunk and JobResult, JobChunking in JobBatch):
round trips, and every claim a hostile message could make about its rows refused before use."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from embedfleet.shared.protocol import (
    ChunkRows,
    EmbedOptions,
    JobBatch,
    JobResult,
    ProtocolError,
    Spans,
    TokenChunk,
    decode,
    encode,
)
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking

# rows 2 and 3 of a job batch of 6 chunk rows: document 0's last chunk (of 3), document 1's only one
ROWS = ChunkRows.of(2, [(0, 2, 3, 10, 20), (1, 0, 1, 0, 4)], ["tail", "next"])


def _token_batch(**wire) -> bytes:
    batch = TokenChunk(
        "j.0",
        "m",
        2,
        6,
        np.array([1, 2, 3], np.int32),
        np.array([0, 2, 3], np.int32),
        1.0,
        job="j",
        batch=0,
        doc_ids=["a", "b"],
        chunks=ROWS,
    )
    body = msgpack.unpackb(encode(batch))
    body.update(wire)
    return msgpack.packb(body)


def _i4(*values: int) -> bytes:
    return np.array(values, "<i4").tobytes()


def test_rows_round_trip_in_token_batches_results_and_job_batches():
    chunks = decode(_token_batch()).chunks
    assert chunks.documents == 2 and chunks.texts == ["tail", "next"]
    assert [a.tolist() for a in (chunks.doc, chunks.chunk, chunks.count, chunks.start, chunks.end)] == [
        [0, 1],
        [2, 0],
        [3, 1],
        [10, 0],
        [20, 4],
    ]
    assert chunks.documents_in(2) == [(0, 0, 3, 0, 1), (1, 3, 1, 1, 2)]  # document 0's chunks are rows 0..2
    result = decode(encode(JobResult("j", 0, 2, ["a", "b"], 2, "f4", np.zeros(4, "<f4").tobytes(), 3, chunks=ROWS)))
    assert result.chunks.texts == ["tail", "next"] and result.chunks.part(1, 2).doc.tolist() == [1]
    job = JobBatch("j", 0, "m", ["a"], ["text"], chunking=JobChunking(ChunkSpec(8, 2, "sentence"), False, True))
    assert decode(encode(job)) == job
    assert decode(encode(JobBatch("j", 0, "m", ["a"], ["text"]))).chunking is None


@pytest.mark.parametrize(
    "wire, why",
    [
        ({"dr": _i4(0)}, "a document, chunk, count, start and end per row"),
        ({"cs": b"\x00\x01"}, "whole number of int32"),
        ({"dn": 1 << 21}, "of at most"),
        ({"dn": 1}, "chunk 0 <= k < count of a document of its job batch"),
        ({"ck": _i4(3, 0)}, "chunk 0 <= k < count"),
        ({"cn": _i4(3, 0)}, "chunk 0 <= k < count"),
        ({"cs": _i4(21, 0)}, "0 <= start <= end"),
        ({"cs": _i4(-1, 0)}, "0 <= start <= end"),
        ({"dr": _i4(0, -1)}, "a document of its job batch"),
        ({"ck": _i4(0, 0), "rows": 4}, "outside the job batch's rows"),  # document 0's 3 chunks: rows 2..4 of 4
        ({"s": 1}, "outside the job batch's rows"),  # document 0's first chunk would be row -1
        ({"x": ["only one"]}, "one per row"),
        ({"dn": "2"}, "'dn' must be int"),
    ],
)
def test_hostile_rows_are_refused(wire, why):
    with pytest.raises(ProtocolError, match=why):
        decode(_token_batch(**wire))


@pytest.mark.parametrize(
    "wire, why",
    [
        ({"sz": 0}, "chunking.size must be an integer of at least 1"),
        ({"sz": 4, "ov": 4}, "chunking.overlap \\(4\\) must be less than chunking.size \\(4\\)"),
        ({"sz": 4, "bd": "page"}, "chunking.boundary must be 'token' or 'sentence'"),
        ({"sz": 4, "lc": "no"}, "chunking.late must be true or false"),
        ({"sz": 4, "wt": 1}, "chunking.with_text must be true or false"),
    ],
)
def test_a_job_batchs_bad_chunking_is_refused(wire, why):
    body = msgpack.unpackb(encode(JobBatch("j", 0, "m", ["a"], ["text"])))
    body.update(wire)
    with pytest.raises(ProtocolError, match=why):
        decode(msgpack.packb(body))


def _late_batch(**wire) -> bytes:
    """A late-chunked token batch: one window of 5 tokens owning both rows' chunks, as its two spans."""
    batch = TokenChunk(
        "j.0",
        "m",
        2,
        6,
        np.array([1, 2, 3, 4, 5], np.int32),
        np.array([0, 5], np.int32),
        1.0,
        EmbedOptions(output="spans", truncate=False),
        job="j",
        batch=0,
        doc_ids=["a", "b"],
        chunks=ROWS,
        spans=Spans.of([[(1, 3), (2, 4)]]),
    )
    body = msgpack.unpackb(encode(batch))
    body.update(wire)
    return msgpack.packb(body)


def test_a_late_batchs_rows_are_its_spans():
    batch = decode(_late_batch())
    assert batch.count == 1 and batch.doc_ids == ["a", "b"] and batch.chunks.doc.tolist() == [0, 1]
    assert batch.spans.firsts.tolist() == [1, 2] and batch.spans.lasts.tolist() == [3, 4]


@pytest.mark.parametrize(
    "wire, why",
    [
        ({"di": ["a"]}, "one document id per row \\(per span, with spans\\)"),  # a row (window), not a span
        ({"rows": 3}, "the rows within the total"),  # two spans from row 2 of 3
        ({"dn": None}, "a bulk batch's spans are a late-chunked job's chunks: it names them"),
        (
            {"sn": _i4(1), "sf": _i4(1), "sl": _i4(3), "di": ["a"]},
            "a document, chunk, count, start and end per row",
        ),  # one span, two chunks
    ],
)
def test_a_late_batch_whose_rows_are_not_its_spans_is_refused(wire, why):
    with pytest.raises(ProtocolError, match=why):
        decode(_late_batch(**wire))
