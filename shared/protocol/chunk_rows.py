"""Which chunk of which document each row of a chunked bulk job's token batch or result is.

A chunked job batch becomes rows in document order, every document's chunks one after the other:
row r is chunk ``chunk[r]`` of the ``count[r]`` chunks of the document at row ``doc[r]`` of its job
batch, that document's characters ``[start[r], end[r])``. So a document's chunks are the rows
``r - chunk[r]`` .. ``r - chunk[r] + count[r]`` of the job batch's rows, wherever they are packed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from embedfleet.shared.protocol.checks import (
    MAX_ROWS,
    TOKEN_DTYPE,
    ProtocolError,
    int32_array,
    required,
    required_int,
    str_list,
)

# key -> field of the per-row arrays (``cs`` / ``ce`` mean what they mean in a ChunkLayout)
_ARRAYS = {"dr": "doc", "ck": "chunk", "cn": "count", "cs": "start", "ce": "end"}


@dataclass(frozen=True, slots=True)
class ChunkRows:
    documents: int  # documents in the job batch (its rows' documents are 0 .. documents - 1)
    doc: np.ndarray  # [rows] int32, the row's document, by its row in the job batch
    chunk: np.ndarray  # [rows] int32, the row's chunk of its document, from 0
    count: np.ndarray  # [rows] int32, chunks of the row's document, >= 1
    start: np.ndarray  # [rows] int32, characters of the document
    end: np.ndarray  # [rows] int32, characters, >= start
    texts: list[str] | None = None  # each row's text (the job asked for them)

    def __len__(self) -> int:
        return len(self.doc)

    @classmethod
    def of(
        cls, documents: int, rows: list[tuple[int, int, int, int, int]], texts: list[str] | None = None
    ) -> ChunkRows:
        """From (doc, chunk, count, start, end) a row."""
        columns = np.array(rows, dtype=TOKEN_DTYPE).reshape(-1, 5).T
        doc, chunk, count, start, end = (np.ascontiguousarray(c) for c in columns)
        return cls(documents, doc, chunk, count, start, end, texts)

    def part(self, lo: int, hi: int) -> ChunkRows:
        """Rows ``lo`` .. ``hi``."""
        return ChunkRows(
            self.documents,
            self.doc[lo:hi],
            self.chunk[lo:hi],
            self.count[lo:hi],
            self.start[lo:hi],
            self.end[lo:hi],
            None if self.texts is None else self.texts[lo:hi],
        )

    def documents_in(self, first: int) -> list[tuple[int, int, int, int, int]]:
        """Per document these rows touch, rows ``first`` onwards in the job batch: (its document, its
        first chunk's row in the job batch, its chunks, the first and end index of its rows here)."""
        out = []
        bounds = np.flatnonzero(np.diff(self.doc)) + 1 if len(self.doc) else np.zeros(0, np.int64)
        for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), len(self.doc)]):
            out.append((int(self.doc[lo]), first + lo - int(self.chunk[lo]), int(self.count[lo]), lo, hi))
        return out

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"dn": self.documents}
        wire |= {
            key: np.ascontiguousarray(getattr(self, name), dtype=TOKEN_DTYPE).tobytes() for key, name in _ARRAYS.items()
        }
        if self.texts is not None:
            wire["x"] = self.texts
        return wire

    @classmethod
    def from_wire(cls, m: dict, rows: int, first: int = 0, total: int | None = None) -> ChunkRows | None:
        """The rows' chunks from a message of ``rows`` rows (None when it carries none), checked: one of
        each per row, each chunk within its document's count, characters in order, and, with the job
        batch's ``total`` rows known, every document's chunks within them (rows ``first`` onwards)."""
        if m.get("dn") is None:
            return None
        documents = required_int(m, "dn")
        arrays = {name: int32_array(required(m, key, bytes), name) for key, name in _ARRAYS.items()}
        if documents > MAX_ROWS or any(len(a) != rows for a in arrays.values()):
            raise ProtocolError(
                f"chunked rows need a document, chunk, count, start and end per row, of at most {MAX_ROWS} documents"
            )
        doc, chunk, count, start, end = arrays.values()
        if rows and (
            doc.min() < 0
            or doc.max() >= documents
            or chunk.min() < 0
            or np.any(chunk >= count)
            or start.min() < 0
            or np.any(start > end)
        ):
            raise ProtocolError(
                "a chunked row is chunk 0 <= k < count of a document of its job batch, its characters 0 <= start <= end"
            )
        if total is not None and rows:
            place = first + np.arange(rows, dtype=np.int64) - chunk  # each row's document's first chunk row
            if place.min() < 0 or np.any(place + count > total):
                raise ProtocolError("a chunked row's document has its chunks outside the job batch's rows")
        texts = None
        if m.get("x") is not None:
            texts = str_list(m, "x")
            if len(texts) != rows:
                raise ProtocolError("a chunked row's text: one per row")
        return cls(documents, doc, chunk, count, start, end, texts)
