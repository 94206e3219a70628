"""shared/jobs/chunks.py: a chunked job's rows gathered from results stored in any order, some twice,
each (document, chunk) kept once; only documents with all their chunks written, in input order."""

from __future__ import annotations

import numpy as np

from embedfleet.shared.jobs.chunks import ChunkedRows
from embedfleet.shared.protocol import ChunkRows


def _vectors(*keys: int) -> np.ndarray:
    return np.array([[k, k] for k in keys], dtype="<f4")


def test_rows_are_kept_once_and_written_by_whole_documents_in_order():
    rows = ChunkedRows()
    # job batch 0: a (2 chunks), b (1); batch 1: c (3 chunks, the last never stored)
    parts = [
        (1, ["c", "c"], ChunkRows.of(1, [(0, 0, 3, 0, 5), (0, 1, 3, 4, 9)], ["c0", "c1"]), _vectors(20, 21)),
        (0, ["a", "b"], ChunkRows.of(2, [(0, 1, 2, 6, 11), (1, 0, 1, 0, 3)], ["a1", "b0"]), _vectors(11, 30)),
        (0, ["a"], ChunkRows.of(2, [(0, 0, 2, 0, 7)], ["a0"]), _vectors(10)),
        (0, ["a", "b"], ChunkRows.of(2, [(0, 1, 2, 6, 11), (1, 0, 1, 0, 3)], ["a1", "b0"]), _vectors(99, 99)),  # again
    ]
    added = [rows.add(batch, ids, vectors, chunks) for batch, ids, chunks, vectors in parts]
    assert added == [(0, 2), (1, 2), (1, 1), (0, 0)] and (rows.complete, rows.chunks) == (2, 5)
    assert rows.whole("a") and rows.whole("b") and not rows.whole("c")
    table, vectors = rows.table()  # by (batch, row): a, b; c left out
    assert (table.ids, table.chunk, table.start, table.end, table.texts) == (
        ["a", "a", "b"],
        [0, 1, 0],
        [0, 6, 0],
        [7, 11, 3],
        ["a0", "a1", "b0"],
    )
    assert np.stack(vectors)[:, 0].tolist() == [10, 11, 30]  # the first copy of a row kept
    table, _ = rows.table(["b", "c", "a"])
    assert table.ids == ["b", "a", "a"] and list(table.columns()) == ["id", "chunk", "start", "end", "text"]


def test_a_row_contradicting_its_documents_chunk_count_is_dropped():
    rows = ChunkedRows()
    rows.add(0, ["a"], _vectors(1), ChunkRows.of(1, [(0, 0, 2, 0, 3)]))
    assert rows.add(0, ["a"], _vectors(2), ChunkRows.of(1, [(0, 1, 3, 2, 5)])) == (0, 0)
    table, _ = rows.table()
    assert table.ids == [] and table.texts is None
