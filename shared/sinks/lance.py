"""LanceDB (embedded, on disk) as a sink: ``lancedb:///path/to/db?table=NAME``.

The table is made when missing, with the columns ``id``, [``chunk``, ``start_char``, ``end_char``,]
``vector``, ``metadata`` (the input's other fields as JSON text) and ``text`` (the row's text, or null).
``vector`` is a fixed-size list of
float32 or float16 (dense), of uint8 bytes (binary and ubinary: packed bits, searched by Hamming
distance in LanceDB), or a list of float32 vectors (multi-vector). A batch is a merge-insert on the
key (id, or id and chunk): written twice, it leaves one row per key. ``finish`` compacts the table
(each merge adds a fragment). ``POST /v1/search`` reads a float table by cosine and a table of
multi-vectors by late interaction (MaxSim), both LanceDB's own exact searches (no index is built).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import numpy as np
import orjson

from embedfleet.shared.sinks.base import Hit, Rows, Shape, SinkError, client_missing
from embedfleet.shared.vectors.forms import FORMS

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


class LanceSink:
    searches_multivector = True  # POST /v1/search serves its tables of multi-vectors (MaxSim, in LanceDB)

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        params = dict(parse_qsl(parts.query))
        self.table_name = params.pop("table", "embeddings")
        if parts.netloc or not parts.path:
            raise SinkError(
                f"{url!r}: a LanceDB URL names a folder on this machine: lancedb:///path/to/db?table=NAME",
                retryable=False,
            )
        if not _NAME.match(self.table_name):
            raise SinkError(
                f"table={self.table_name!r} is not a plain table name (letters, digits, _ . -)", retryable=False
            )
        if params:
            raise SinkError(
                f"unknown LanceDB URL parameters {', '.join(sorted(params))}: it takes 'table'", retryable=False
            )
        self.path = parts.path
        self.shown = f"lancedb://{self.path}?table={self.table_name}"
        self._table: Any = None
        self._shape: Shape | None = None

    def _error(self, exc: Exception) -> SinkError:
        if (missing := client_missing(exc, self.shown)) is not None:
            return missing
        # a local folder: a full disk or a folder gone may clear up, anything else will not
        retryable = isinstance(exc, OSError) or "No space left" in str(exc)
        return SinkError(f"LanceDB at {self.shown}: {str(exc).strip() or type(exc).__name__}", retryable)

    def _schema(self, shape: Shape):
        import pyarrow as pa

        if shape.output == "sparse" or shape.form in ("int8", "uint8"):
            what = "sparse" if shape.output == "sparse" else shape.form
            raise SinkError(
                f"LanceDB takes float32, float16, binary, ubinary and multi-vector rows, not {what}: "
                "store these in files or another sink",
                retryable=False,
            )
        if shape.output == "multivector":
            vector = pa.list_(pa.list_(pa.float32(), shape.dim))
        elif FORMS[shape.form].packed:
            vector = pa.list_(pa.uint8(), -(-shape.dim // 8))
        else:
            vector = pa.list_(pa.float16() if shape.form == "float16" else pa.float32(), shape.dim)
        chunk = [("chunk", pa.int32()), ("start_char", pa.int32()), ("end_char", pa.int32())] if shape.chunked else []
        return pa.schema(
            [("id", pa.string()), *chunk, ("vector", vector), ("metadata", pa.string()), ("text", pa.string())]
        )

    def open(self, shape: Shape) -> None:
        import lancedb

        schema = self._schema(shape)
        self._shape = shape
        try:
            db = lancedb.connect(self.path)
            if self.table_name in db.list_tables().tables:
                self._table = db.open_table(self.table_name)
            else:
                self._table = db.create_table(self.table_name, schema=schema)
            found = self._table.schema
        except Exception as exc:
            raise self._error(exc) from None
        if found != schema:
            raise SinkError(
                f"table {self.table_name} has the columns {found.to_string(show_schema_metadata=False)!r}; "
                "this job's rows need another layout: name another table",
                retryable=False,
            )

    def attach(self) -> Shape:
        import lancedb
        import pyarrow as pa

        try:
            db = lancedb.connect(self.path)
            if self.table_name not in db.list_tables().tables:
                raise SinkError(f"LanceDB at {self.shown}: no table {self.table_name}: load one first", retryable=False)
            self._table = db.open_table(self.table_name)
            schema = self._table.schema
        except SinkError:
            raise
        except Exception as exc:
            raise self._error(exc) from None
        vector = schema.field("vector").type if "vector" in schema.names else None
        if isinstance(vector, pa.ListType) and pa.types.is_fixed_size_list(vector.value_type):  # a list of vectors
            shape = Shape("float32", "multivector", vector.value_type.list_size)
        elif isinstance(vector, pa.FixedSizeListType) and vector.value_type in (pa.float32(), pa.float16(), pa.uint8()):
            packed = vector.value_type == pa.uint8()  # packed bits: 8 components a byte
            form = "ubinary" if packed else "float16" if vector.value_type == pa.float16() else "float32"
            shape = Shape(form, "dense", vector.list_size * (8 if packed else 1))
        else:
            raise SinkError(f"table {self.table_name} has no vector column a load makes ({vector})", retryable=False)
        self._shape = Shape(shape.form, shape.output, shape.dim, "chunk" in schema.names)
        return self._shape

    def write(self, rows: Rows) -> None:
        import pyarrow as pa

        shape = self._shape
        assert shape is not None and self._table is not None, "open() first"
        schema = self._table.schema
        keyed: dict[tuple, int] = {}  # the last row of a key given twice in one batch wins
        for i, doc_id in enumerate(rows.ids):
            keyed[(doc_id, rows.chunks[i][0]) if shape.chunked and rows.chunks else (doc_id,)] = i
        take = list(keyed.values())
        if shape.output == "multivector":
            vectors = [np.asarray(rows.vectors[i], dtype=np.float32).tolist() for i in take]
        else:
            dense = np.asarray(rows.vectors)[take]
            if shape.form == "binary":  # bytes shifted by -128: back to the plain packed bits
                dense = (dense.astype(np.int16) + 128).astype(np.uint8)
            vectors = pa.FixedSizeListArray.from_arrays(pa.array(dense.reshape(-1)), dense.shape[1])
        columns: dict[str, Any] = {"id": [rows.ids[i] for i in take]}
        if shape.chunked:
            chunks = [rows.chunks[i] if rows.chunks else (0, None, None) for i in take]
            columns |= {
                "chunk": [c[0] for c in chunks],
                "start_char": [c[1] for c in chunks],
                "end_char": [c[2] for c in chunks],
            }
        metadata = rows.metadata or [None] * len(rows.ids)
        columns |= {
            "vector": vectors,
            "metadata": [None if metadata[i] is None else orjson.dumps(metadata[i]).decode() for i in take],
            "text": [rows.texts[i] if rows.texts is not None else None for i in take],
        }
        key = ["id", "chunk"] if shape.chunked else ["id"]
        try:
            table = pa.table(columns, schema=schema)
            self._table.merge_insert(key).when_matched_update_all().when_not_matched_insert_all().execute(table)
        except Exception as exc:
            raise self._error(exc) from None

    def finish(self) -> None:
        assert self._table is not None, "open() first"
        try:
            self._table.optimize()
        except Exception as exc:
            raise self._error(exc) from None

    def count(self) -> int:
        assert self._table is not None, "open() first"
        try:
            return int(self._table.count_rows())
        except Exception as exc:
            raise self._error(exc) from None

    def search(self, vector: np.ndarray, top_k: int, where: dict[str, Any] | None = None) -> list[Hit]:
        """``vector``: float32 [dim] for a dense table, or the query's token vectors [q, dim] for a table of
        multi-vectors, which LanceDB ranks by late interaction itself (exact without an index, and a load
        builds none). Its cosine distance of a multi-vector query is the sum over the query's rows of 1 - the
        row's largest cosine with the page's vectors, q - MaxSim: the score answered is MaxSim (the vectors
        are unit length, so cosines are dot products), as POST /v1/rerank scores a multi-vector model."""
        shape = self._shape
        assert shape is not None and self._table is not None, "open() first"
        multi = shape.output == "multivector"
        if where or not (multi or (shape.output == "dense" and shape.form in ("float32", "float16"))):
            raise SinkError(
                "LanceDB tables are searched by dense float vectors or multi-vectors without filters here: "
                "search a pgvector or Qdrant sink",
                retryable=False,
            )
        query = vector.astype(np.float32)
        assert query.ndim == (2 if multi else 1), f"a query of shape {query.shape} for {shape.output} rows"
        columns = ["id", *(["chunk"] if shape.chunked else []), "metadata", "text", "_distance"]  # not the vectors
        try:
            found = self._table.search(query).distance_type("cosine").select(columns).limit(top_k).to_list()
        except Exception as exc:
            raise self._error(exc) from None
        most = float(len(query)) if multi else 1.0  # the score of a distance of 0
        return [
            Hit(
                r["id"],
                most - float(r["_distance"]),
                orjson.loads(r["metadata"]) if r["metadata"] else {},
                r.get("chunk"),
                r.get("text"),
            )
            for r in found
        ]

    def close(self) -> None:
        self._table = None
