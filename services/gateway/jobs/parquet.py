"""A job's vectors as a Parquet file made a row group at a time and handed out as it is written, so a
response streams it without holding the job: columns ``id`` and ``vector`` (as ``embedfleet reindex``
writes .parquet: a list of the form's type; sparse a struct of ``indices`` and ``values`` lists;
multivector a list of vectors), with ``embedding_type``, ``dim`` and ``output`` in the schema metadata.
A chunked job's has a row a chunk: ``id``, ``chunk`` (int32), ``start``, ``end`` (int64, characters),
``vector`` and, when the job stores texts, ``text``; ``chunking`` (JSON) in the metadata too.

Columns are built from the rows' flat arrays and offsets (no Python object per value).
"""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedfleet.shared.jobs.chunks import stored_columns
from embedfleet.shared.jobs.results import JobForm, Stored
from embedfleet.shared.vectors.forms import FORMS

# a row group ends at this many documents or bytes of vectors: what the response holds before sending
# them (a multivector document can hold a few hundred kB)
ROW_GROUP = 4096
ROW_GROUP_BYTES = 16 << 20


class ParquetStream:
    """``add`` parts as they are read, ``finish`` at the end; each returns the file's bytes written since."""

    def __init__(self, form: JobForm) -> None:
        self._form = form
        value = pa.from_numpy_dtype(FORMS[form.form].dtype)
        self._type = {
            "dense": pa.list_(value),
            "multivector": pa.list_(pa.list_(value)),
            "sparse": pa.struct([("indices", pa.list_(pa.int32())), ("values", pa.list_(value))]),
        }[form.output]
        self._sink = io.BytesIO()
        self._writer: pq.ParquetWriter | None = None
        self._parts: list[Stored] = []
        self._documents = 0
        self._held = 0  # bytes of the vectors in _parts

    def add(self, part: Stored) -> bytes:
        if self._writer is None:
            self._open(part.dim)
        self._parts.append(part)
        self._documents += len(part.doc_ids)
        self._held += sum(a.nbytes for a in _arrays(part, self._form.output))
        return self._flush() if self._documents >= ROW_GROUP or self._held >= ROW_GROUP_BYTES else b""

    def finish(self, dim: int) -> bytes:
        if self._writer is None:
            self._open(dim)
        tail = self._flush()
        self._opened().close()
        return tail + self._taken()

    def _open(self, dim: int) -> None:
        meta = {"embedding_type": self._form.form, "dim": str(dim), "output": self._form.output}
        fields = [("id", pa.string()), ("vector", self._type)]
        if self._form.chunking is not None:  # a row a chunk: its place in its document
            meta["chunking"] = json.dumps(self._form.chunking.record())
            fields[1:1] = [("chunk", pa.int32()), ("start", pa.int64()), ("end", pa.int64())]
            fields += [("text", pa.string())] if self._form.with_text else []
        self._writer = pq.ParquetWriter(self._sink, pa.schema(fields, metadata=meta))

    def _opened(self) -> pq.ParquetWriter:
        assert self._writer is not None  # by the first add, or by finish
        return self._writer

    def _flush(self) -> bytes:
        if self._parts:
            writer = self._opened()
            columns = {
                "id": pa.array([d for part in self._parts for d in part.doc_ids], pa.string()),
                "vector": _column(self._parts, self._form.output, self._type),
            }
            if self._form.chunking is not None:
                places = []
                for part in self._parts:
                    assert part.chunks is not None  # StoredResults checks each result is of the job's kind
                    places.append(stored_columns(part.doc_ids, part.chunks))
                for name in ("chunk", "start", "end") + (("text",) if self._form.with_text else ()):
                    kind = writer.schema.field(name).type
                    columns[name] = pa.array(
                        [v for place in places for v in (place.columns().get(name) or [""] * len(place.ids))], kind
                    )
            arrays = [columns[name] for name in writer.schema.names]
            writer.write_table(pa.Table.from_arrays(arrays, schema=writer.schema))
            self._parts, self._documents, self._held = [], 0, 0
        return self._taken()

    def _taken(self) -> bytes:
        data = self._sink.getvalue()
        self._sink.seek(0)
        self._sink.truncate()
        return data


def _arrays(part: Stored, output: str) -> list[np.ndarray]:
    if output == "dense":
        return [np.asarray(part.rows)]  # [rows, width] already
    if output == "sparse":
        return [a for pair in part.rows for a in pair]
    return list(part.rows)


def _lists(counts: list[int] | np.ndarray, values: pa.Array) -> pa.ListArray:
    """A list a count: list i holds the next ``counts[i]`` of ``values``."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _column(parts: list[Stored], output: str, kind: pa.DataType) -> pa.Array:
    """The ``vector`` column of ``parts``' documents, of type ``kind``."""
    if output == "dense":
        rows = np.concatenate([part.rows for part in parts])  # [n, width]
        column = _lists(np.full(len(rows), rows.shape[1]), pa.array(rows.reshape(-1)))
    elif output == "sparse":
        pairs = [pair for part in parts for pair in part.rows]
        counts = [len(i) for i, _ in pairs]
        indices = _lists(counts, pa.array(np.concatenate([i for i, _ in pairs]).astype(np.int32)))
        values = _lists(counts, pa.array(np.concatenate([v for _, v in pairs])))
        column = pa.StructArray.from_arrays([indices, values], names=["indices", "values"])
    else:
        docs = [m for part in parts for m in part.rows]  # each [tokens, width]
        flat = np.concatenate(docs)  # [all tokens, width]
        tokens = _lists(np.full(len(flat), flat.shape[1]), pa.array(flat.reshape(-1)))
        column = _lists([len(m) for m in docs], tokens)
    return column.cast(kind)
