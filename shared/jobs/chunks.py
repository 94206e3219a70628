"""A chunked job's rows as its readers gather them (``embedfleet reindex``, ``embedfleet jobs fetch``):
each (document, chunk) once, whichever results repeat it, and which documents have all their chunks.

A row is the chunk's vector with its place: ``chunk`` (k, from 0), ``start`` and ``end`` (characters of
the document's text, Python string indices: ``text[start:end]`` is the chunk) and, when the job stores
them, ``text``. Only documents whose chunks are all there are written: a document given up (one of its
chunks lost) is listed as failed, never written in part.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from embedfleet.shared.protocol import ChunkRows

log = logging.getLogger("embedfleet.job_chunks")

COLUMNS = ("id", "chunk", "start", "end")  # a chunked job's columns besides ``vector`` (and ``text``)


@dataclass(frozen=True, slots=True)
class ChunkTable:
    """Rows in order: row i is chunk ``chunk[i]`` of document ``ids[i]``, its characters [start[i], end[i])."""

    ids: list[str]
    chunk: list[int]
    start: list[int]
    end: list[int]
    texts: list[str] | None

    def columns(self) -> dict[str, list]:
        """The table's columns by name, ``text`` last when there are texts."""
        columns: tuple[list, ...] = (self.ids, self.chunk, self.start, self.end)
        return dict(zip(COLUMNS, columns)) | ({} if self.texts is None else {"text": self.texts})


class ChunkedRows:
    """Rows gathered from results: ``add`` each result's, ``table`` the complete documents' in order."""

    def __init__(self) -> None:
        # document id -> (its chunks, its place: (job batch, row in it)); its rows by chunk
        self._docs: dict[str, tuple[int, tuple[int, int]]] = {}
        self._rows: dict[str, dict[int, tuple[np.ndarray, int, int, str | None]]] = {}
        self.complete = 0  # documents whose chunks are all here
        self.chunks = 0  # rows gathered
        self.fresh: list[str] = []  # documents completed since a reader last took them (``take_fresh``)

    def add(self, batch: int, doc_ids: list[str], rows, chunks: ChunkRows) -> tuple[int, int]:
        """A result's rows (``rows[i]``: the vector of row i); returns (documents it completed, new rows).
        A row naming another chunk count for its document than an earlier one is not the job's: dropped."""
        documents = new = 0
        texts = chunks.texts
        for i, doc_id in enumerate(doc_ids):
            k, count = int(chunks.chunk[i]), int(chunks.count[i])
            known = self._docs.setdefault(doc_id, (count, (batch, int(chunks.doc[i]))))
            if known[0] != count:
                log.error(
                    "document %r: a row says %d chunks, an earlier one %d: dropped", doc_id[:100], count, known[0]
                )
                continue
            have = self._rows.setdefault(doc_id, {})
            if k in have:
                continue
            have[k] = (rows[i], int(chunks.start[i]), int(chunks.end[i]), None if texts is None else texts[i])
            new += 1
            if len(have) == count:
                documents += 1
                self.fresh.append(doc_id)
        self.complete += documents
        self.chunks += new
        return documents, new

    def rows_of(self, doc_id: str) -> list[tuple[int, np.ndarray, int, int, str | None]]:
        """A document's rows in chunk order: (chunk, vector, start, end, text)."""
        return [(k, *row) for k, row in sorted(self._rows.get(doc_id, {}).items())]

    def whole(self, doc_id: str) -> bool:
        """Whether every chunk of ``doc_id`` is here."""
        known = self._docs.get(doc_id)
        return known is not None and len(self._rows.get(doc_id, ())) == known[0]

    def table(self, order: list[str] | None = None) -> tuple[ChunkTable, list[np.ndarray]]:
        """The rows of the complete documents, in ``order`` (document ids; None: the job's input order,
        by batch and row), each document's chunks in order; and their vectors in the same order."""
        if order is None:
            order = sorted(self._docs, key=lambda d: self._docs[d][1])
        table = ChunkTable([], [], [], [], None if not self._with_text() else [])
        vectors = []
        for doc_id in (d for d in order if self.whole(d)):
            for k, (vector, start, end, text) in sorted(self._rows[doc_id].items()):
                table.ids.append(doc_id)
                table.chunk.append(k)
                table.start.append(start)
                table.end.append(end)
                if table.texts is not None:
                    table.texts.append(text or "")
                vectors.append(vector)
        return table, vectors

    def _with_text(self) -> bool:
        return any(text is not None for rows in self._rows.values() for _, _, _, text in rows.values())


def stored_columns(doc_ids: list[str], chunks: ChunkRows) -> ChunkTable:
    """A stored result's rows' places, as columns (what the results route streams beside the vectors)."""
    return ChunkTable(list(doc_ids), chunks.chunk.tolist(), chunks.start.tolist(), chunks.end.tolist(), chunks.texts)
