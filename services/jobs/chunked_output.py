"""A chunked job's output files, as ``embedfleet reindex`` and ``embedfleet jobs fetch`` write them: a row
a chunk, in input order (documents in the job's order, each document's chunks in order).

- ``.parquet``: columns ``id``, ``chunk`` (int32, from 0), ``start`` and ``end`` (int64, characters:
  ``text[start:end]`` is the chunk), ``vector`` (a list of the form's type) and, with ``--with-text``,
  ``text``; the schema's metadata holds ``embedding_type``, ``dim`` and ``chunking`` (JSON: size,
  overlap, boundary, late, with_text).
- ``.npy``: the vectors ``[rows, width]``; beside it ``.ids.json`` (each row's document id, as for a
  job without chunks) and ``.chunks.jsonl``, one ``{"id", "chunk", "start", "end"[, "text"]}`` a line,
  line i describing row i.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from embedfleet.shared.jobs.chunks import ChunkTable

SIDECAR = ".chunks.jsonl"


def write_chunked(out: Path, table: ChunkTable, vectors: np.ndarray, form: str, dim: int, chunking: dict) -> None:
    """``vectors``: [rows, stored width] of the form's element type, row i the chunk ``table`` names at i."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns = {
            "id": pa.array(table.ids, pa.string()),
            "chunk": pa.array(table.chunk, pa.int32()),
            "start": pa.array(table.start, pa.int64()),
            "end": pa.array(table.end, pa.int64()),
            "vector": pa.array(list(vectors), pa.list_(pa.from_numpy_dtype(vectors.dtype))),
        }
        if table.texts is not None:
            columns["text"] = pa.array(table.texts, pa.string())
        meta = {
            "embedding_type": form,
            "dim": str(dim or (vectors.shape[1] if vectors.ndim == 2 else 0)),
            "chunking": json.dumps(chunking),
        }
        pq.write_table(pa.table(columns).replace_schema_metadata(meta), out)
        return
    np.save(out, vectors)
    out.with_suffix(".ids.json").write_text(json.dumps(table.ids))
    names = table.columns()
    with out.with_suffix(SIDECAR).open("w") as sidecar:
        for values in zip(*names.values()):
            sidecar.write(json.dumps(dict(zip(names, values)), ensure_ascii=False) + "\n")
