"""PostgreSQL with pgvector as a sink: ``postgresql://USER[:PASSWORD]@HOST:PORT/DB?table=NAME[&index=none]``.

The URL is libpq's: its other parameters (``host=/socket/dir``, ``sslmode``, ``passfile``…) pass
through, and so do libpq's variables (PGPASSWORD, PGPASSFILE, PGUSER…), so a password need not be in
the URL at all; where it is, ``shown`` hides it. The table is made when missing:

    id text, [chunk int, start_char int, end_char int,] embedding <type>(D), metadata jsonb, text text,
    primary key (id) or (id, chunk)

with the type of the job's vectors: ``vector`` (float32), ``halfvec`` (float16), ``bit`` (binary,
ubinary) or ``sparsevec`` (sparse outputs). A batch is copied into a temporary table, then upserted in
the same transaction: a batch written twice leaves one row per key. ``finish`` builds an HNSW index
(cosine; Hamming for bits) unless ``index=none``.
"""

from __future__ import annotations

import re
import sys
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import numpy as np

from embedfleet.shared.sinks.base import Hit, Rows, Shape, SinkError, client_missing
from embedfleet.shared.vectors.forms import FLOAT32, FORMS

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
# pgvector's type, its HNSW operator class and distance operator, by the job's form (sparse: by output)
_TYPES = {
    "float32": ("vector", "vector_cosine_ops", "<=>"),
    "float16": ("halfvec", "halfvec_cosine_ops", "<=>"),
    "binary": ("bit", "bit_hamming_ops", "<~>"),
    "ubinary": ("bit", "bit_hamming_ops", "<~>"),
    "sparse": ("sparsevec", "sparsevec_cosine_ops", "<=>"),
}
# the most dimensions pgvector's HNSW indexes (non-zero elements for sparsevec)
_INDEX_LIMITS = {"vector": 2000, "halfvec": 4000, "bit": 64000}
# pgvector releases that brought a type (or its HNSW operator class); the bit type itself is PostgreSQL's
_SINCE = {"halfvec": (0, 7), "sparsevec": (0, 7), "bit": (0, 7)}
MAX_EF_SEARCH = 1000  # pgvector's largest hnsw.ef_search: the most rows one HNSW search answers
_RETRYABLE_CLASSES = ("08", "53", "57", "40", "58")  # connection, resources, operator, rollback, system
# a column's type -> the form its rows are read as, from _TYPES: bits as ubinary (binary rows are the same
# bits, each byte shifted), a sparsevec's values as float32
_FORMS = {kind: FLOAT32.name if key == "sparse" else key for key, (kind, _, _) in _TYPES.items() if key != "binary"}
_COLUMN = re.compile(r"^(\w+)\((\d+)\)$")  # format_type's "vector(384)"


class PgVectorSink:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        params = dict(parse_qsl(parts.query, keep_blank_values=True))
        self.table = params.pop("table", "embeddings")
        index = params.pop("index", "hnsw")
        if not _NAME.match(self.table):
            raise SinkError(f"table={self.table!r} is not a plain table name (letters, digits, _)", retryable=False)
        if self.table.lower().startswith("pg_"):  # refused here, before anything is connected to or made
            raise SinkError(
                f"table={self.table!r}: names beginning with pg_ are PostgreSQL's own (its catalogs are found "
                "before any table of that name): name another table",
                retryable=False,
            )
        if index not in ("hnsw", "none"):
            raise SinkError(f"index={index!r}: use 'hnsw' (the default) or 'none'", retryable=False)
        self.index = index == "hnsw"
        self._password = parts.password or ""
        # %20, never +, for a space: libpq decodes only %XX (a socket folder's path may hold spaces)
        self._conninfo = urlunsplit(parts._replace(query=urlencode(params, quote_via=quote)))
        host = parts.netloc.rpartition("@")[2]
        user = f"{parts.username}{':***' if parts.password else ''}@" if parts.username else ""
        shown_params = {k: v for k, v in params.items() if k != "password"}
        query = urlencode(
            {**shown_params, "table": self.table, **({} if self.index else {"index": "none"})},
            safe="/",
            quote_via=quote,
        )
        self.shown = urlunsplit((parts.scheme, user + host, parts.path, query, ""))
        self._conn: Any = None
        self._shape: Shape | None = None

    # -- the store's errors ---------------------------------------------------------------------

    def _error(self, exc: Exception) -> SinkError:
        if (missing := client_missing(exc, self.shown)) is not None:
            return missing
        # psycopg's errors only where it was imported: its import may be what failed
        psycopg = sys.modules.get("psycopg")
        message = str(exc).strip() or type(exc).__name__
        if self._password:
            message = message.replace(self._password, "***")
        state = getattr(exc, "sqlstate", None) or ""
        broken = psycopg is not None and isinstance(exc, psycopg.OperationalError)
        retryable = broken or state[:2] in _RETRYABLE_CLASSES
        if retryable and self._conn is not None:  # a broken connection is made again on the next call
            self.close()
        return SinkError(f"PostgreSQL at {self.shown}: {message}", retryable)

    def _connection(self):
        import psycopg
        from pgvector.psycopg import register_vector

        if self._conn is None or self._conn.closed:
            # autocommit: each ``transaction()`` block is a transaction of its own, committed when it ends
            self._conn = psycopg.connect(self._conninfo, connect_timeout=10, autocommit=True)
            self._conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            register_vector(self._conn)
        return self._conn

    # -- the table ------------------------------------------------------------------------------

    def _type(self, shape: Shape) -> tuple[str, str, str]:
        key = "sparse" if shape.output == "sparse" else shape.form
        if shape.output == "multivector":
            raise SinkError(
                "pgvector has no multi-vector column: send multi-vector jobs to Qdrant or LanceDB, or to files",
                retryable=False,
            )
        if key not in _TYPES:
            raise SinkError(
                f"pgvector has no {shape.form} vectors: use float32, float16, binary or ubinary", retryable=False
            )
        return _TYPES[key]

    def open(self, shape: Shape) -> None:
        from psycopg import sql

        kind, _, _ = self._type(shape)
        self._shape = shape
        column = f"{kind}({shape.dim})"
        chunk_cols = (
            sql.SQL("chunk integer NOT NULL, start_char integer, end_char integer, ") if shape.chunked else sql.SQL("")
        )
        key = sql.SQL("id, chunk" if shape.chunked else "id")
        table = sql.Identifier(self.table)
        try:
            conn = self._connection()
            version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0]
        except Exception as exc:
            raise self._error(exc) from None
        have = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
        if have < _SINCE.get(kind, (0, 0)):
            raise SinkError(
                f"this server's pgvector is {version}; {kind} columns need pgvector "
                f"{'.'.join(map(str, _SINCE[kind]))} or later",
                retryable=False,
            )
        try:
            with conn.transaction():
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {} (id text NOT NULL, {}embedding {} NOT NULL, "
                        "metadata jsonb, text text, PRIMARY KEY ({}))"
                    ).format(table, chunk_cols, sql.SQL(column), key)
                )
                columns = self._columns(conn)
        except Exception as exc:
            raise self._error(exc) from None
        if columns.get("embedding") != column:
            raise SinkError(
                f"table {self.table} holds embedding {columns.get('embedding')}; this job makes {column}: "
                "name another table",
                retryable=False,
            )
        if shape.chunked != ("chunk" in columns):
            raise SinkError(
                f"table {self.table} {'has no' if shape.chunked else 'has a'} chunk column; this job "
                f"{'chunks' if shape.chunked else 'does not chunk'} its documents: name another table",
                retryable=False,
            )

    @property
    def table_name(self) -> str:
        return self.table

    def _columns(self, conn) -> dict[str, str]:
        """The table's columns and their types as PostgreSQL writes them (``vector(384)``); none: no table.
        The table is the one ``CREATE TABLE`` makes, in the current schema (never one of that name found
        first on the search path); its name quoted, as the statements quote it (unquoted, PostgreSQL would
        fold it to lower case)."""
        return dict(
            conn.execute(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                "WHERE a.attrelid = to_regclass(quote_ident(current_schema()) || '.' || quote_ident(%s)) "
                "AND a.attnum > 0 AND NOT a.attisdropped",
                (self.table,),
            ).fetchall()
        )

    def attach(self) -> Shape:
        try:
            columns = self._columns(self._connection())
        except Exception as exc:
            raise self._error(exc) from None
        if not columns:
            raise SinkError(f"PostgreSQL at {self.shown}: no table {self.table}: load one first", retryable=False)
        found = _COLUMN.match(columns.get("embedding", ""))
        if found is None or found.group(1) not in _FORMS:
            raise SinkError(
                f"table {self.table} has no embedding column of pgvector's ({columns.get('embedding')})",
                retryable=False,
            )
        kind, dim = found.group(1), int(found.group(2))
        self._shape = Shape(_FORMS[kind], "sparse" if kind == "sparsevec" else "dense", dim, "chunk" in columns)
        return self._shape

    def _values(self, rows: Rows) -> list:
        """The batch's embedding column, as pgvector's adapters take it."""
        from pgvector import Bit, HalfVector, SparseVector, Vector

        shape = self._shape
        assert shape is not None, "open() first"
        if shape.output == "sparse":
            return [SparseVector(dict(zip(map(int, idx), map(float, val))), shape.dim) for idx, val in rows.vectors]
        vectors = np.asarray(rows.vectors)
        if shape.form == "float16":
            return [HalfVector(v) for v in vectors.astype(np.float16)]
        if FORMS[shape.form].packed:  # packed bits (binary: each byte shifted by -128)
            packed = (
                (vectors.astype(np.int16) + 128).astype(np.uint8)
                if shape.form == "binary"
                else vectors.astype(np.uint8)
            )
            return [Bit(bits[: shape.dim]) for bits in np.unpackbits(packed, axis=1).astype(bool)]
        return [Vector(v) for v in vectors.astype(np.float32)]

    def write(self, rows: Rows) -> None:
        from psycopg import sql
        from psycopg.types.json import Jsonb

        shape = self._shape
        assert shape is not None, "open() first"
        values = self._values(rows)
        keyed: dict[tuple, tuple] = {}  # the last row of a key given twice in one batch wins
        for i, doc_id in enumerate(rows.ids):
            meta = Jsonb(rows.metadata[i]) if rows.metadata is not None and rows.metadata[i] is not None else None
            text = rows.texts[i] if rows.texts is not None else None
            if shape.chunked:
                chunk, start, end = rows.chunks[i] if rows.chunks is not None else (0, None, None)
                keyed[(doc_id, chunk)] = (doc_id, chunk, start, end, values[i], meta, text)
            else:
                keyed[(doc_id,)] = (doc_id, values[i], meta, text)
        names = ["id", *(["chunk", "start_char", "end_char"] if shape.chunked else []), "embedding", "metadata", "text"]
        table, stage = sql.Identifier(self.table), sql.Identifier(f"embedfleet_stage_{self.table}"[:63])
        cols = sql.SQL(", ").join(map(sql.Identifier, names))
        update = sql.SQL(", ").join(
            sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n)) for n in names if n not in ("id", "chunk")
        )
        key = sql.SQL("id, chunk" if shape.chunked else "id")
        try:
            conn = self._connection()
            with conn.transaction():
                conn.execute(
                    sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {}) ON COMMIT DELETE ROWS").format(stage, table)
                )
                with conn.cursor().copy(sql.SQL("COPY {} ({}) FROM STDIN").format(stage, cols)) as copy:
                    for row in keyed.values():
                        copy.write_row(row)
                conn.execute(
                    sql.SQL("INSERT INTO {0} ({1}) SELECT {1} FROM {2} ON CONFLICT ({3}) DO UPDATE SET {4}").format(
                        table, cols, stage, key, update
                    )
                )
        except SinkError:
            raise
        except Exception as exc:
            raise self._error(exc) from None

    def finish(self) -> None:
        from psycopg import sql

        shape = self._shape
        assert shape is not None, "open() first"
        kind, ops, _ = self._type(shape)
        if not self.index:
            return
        if shape.dim > _INDEX_LIMITS.get(kind, 1 << 30):
            raise SinkError(
                f"pgvector's HNSW index takes {kind} of at most {_INDEX_LIMITS[kind]} dimensions, these have "
                f"{shape.dim}: add index=none to the URL (or store float16)",
                retryable=False,
            )
        try:
            conn = self._connection()
            with conn.transaction():
                conn.execute(
                    sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} USING hnsw (embedding {})").format(
                        sql.Identifier(f"{self.table}_embedding_hnsw"[:63]), sql.Identifier(self.table), sql.SQL(ops)
                    )
                )
                conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(self.table)))
        except Exception as exc:
            raise self._error(exc) from None

    def count(self) -> int:
        from psycopg import sql

        try:
            return int(
                self._connection()
                .execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(self.table)))
                .fetchone()[0]
            )
        except Exception as exc:
            raise self._error(exc) from None

    def search(self, vector: np.ndarray, top_k: int, where: dict[str, Any] | None = None) -> list[Hit]:
        from pgvector import HalfVector, Vector
        from psycopg import sql
        from psycopg.types.json import Jsonb

        shape = self._shape
        assert shape is not None, "open() first"
        kind, _, op = self._type(shape)
        if kind not in ("vector", "halfvec"):
            raise SinkError(
                f"search over {kind} columns is not served: search a float32 or float16 table", retryable=False
            )
        query = HalfVector(vector.astype(np.float16)) if kind == "halfvec" else Vector(vector.astype(np.float32))
        chunk = sql.SQL(", chunk") if shape.chunked else sql.SQL(", NULL")
        filtered = sql.SQL("WHERE metadata @> %(where)s") if where else sql.SQL("")
        statement = sql.SQL(
            "SELECT id{}, embedding {} %(q)s AS distance, metadata, text FROM {} {} ORDER BY distance LIMIT %(k)s"
        ).format(chunk, sql.SQL(op), sql.Identifier(self.table), filtered)
        try:
            conn = self._connection()
            with conn.transaction():
                # a wider candidate list than pgvector's default 40 (recall@k stays high for k up to ~50), and
                # never fewer candidates than rows asked for: HNSW answers at most ef_search rows
                ef_search = min(MAX_EF_SEARCH, max(100, 2 * top_k))
                conn.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(sql.Literal(ef_search)))
                found = conn.execute(statement, {"q": query, "k": top_k, "where": Jsonb(where or {})}).fetchall()
        except Exception as exc:
            raise self._error(exc) from None
        return [
            Hit(doc_id, 1.0 - float(distance), meta or {}, chunk, text) for doc_id, chunk, distance, meta, text in found
        ]

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a broken connection: nothing left to release
                pass
