"""Qdrant as a sink: ``qdrant://HOST:PORT?collection=NAME`` (a server, its REST port), or
``qdrant:///path/to/dir?collection=NAME`` (qdrant-client's local mode: a folder on this machine).

An API key comes from QDRANT_API_KEY or from a file named by ``api_key_file=``, never from the URL.
The collection is made when missing, with one named vector of the job's output: ``dense`` (float32,
float16 or uint8 components, cosine), ``sparse`` (Qdrant's sparse vectors, dot product) or
``multivector`` (late interaction, MaxSim). A point's id is a UUID made from the document's id (and
chunk), so a batch upserted twice leaves one point per key; the payload holds ``id``, ``metadata``,
``text`` (when the rows have one) and, for chunks, ``chunk``, ``start_char``, ``end_char``.
``POST /v1/search`` reads a dense collection by cosine and a collection of multi-vectors by Qdrant's
own late interaction (MAX_SIM), both with filters on the metadata.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import numpy as np

from embedfleet.shared.sinks.base import Hit, Rows, Shape, SinkError, client_missing

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,254}$")
_IDS = uuid.UUID("6f0e3c0a-53a4-4c8e-9d3b-7a1f4b2e9c10")  # the namespace of point ids
_NAMES = {"dense": "dense", "sparse": "sparse", "multivector": "multivector"}  # the named vector of each output
# the forms Qdrant stores, each as its datatype of the same name
_DATATYPES = ("float32", "float16", "uint8")
_BUSY = "is already accessed by another instance"  # qdrant-client's words for a local folder locked by another


def point_id(doc_id: str, chunk: int | None) -> str:
    return str(uuid.uuid5(_IDS, doc_id if chunk is None else f"{doc_id}\x00{chunk}"))


class QdrantSink:
    searches_multivector = True  # POST /v1/search serves its collections of multi-vectors (MAX_SIM, in Qdrant)

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        params = dict(parse_qsl(parts.query))
        self.collection = params.pop("collection", "embeddings")
        key_file = params.pop("api_key_file", None)
        if params:
            raise SinkError(
                f"unknown Qdrant URL parameters {', '.join(sorted(params))}: it takes 'collection' and 'api_key_file'",
                retryable=False,
            )
        if not _NAME.match(self.collection):
            raise SinkError(
                f"collection={self.collection!r} is not a plain name (letters, digits, _ -)", retryable=False
            )
        self.local = not parts.netloc
        if self.local and not parts.path:
            raise SinkError(
                f"{url!r}: name a server (qdrant://HOST:PORT) or a folder (qdrant:///path)", retryable=False
            )
        self._where = parts.path if self.local else (parts.hostname or "localhost", parts.port or 6333)
        self._api_key = Path(key_file).read_text().strip() if key_file else os.environ.get("QDRANT_API_KEY")
        where = parts.path if self.local else parts.netloc.rpartition("@")[2]  # a local path begins with /
        self.shown = f"qdrant://{where}?collection={self.collection}"
        self._client: Any = None
        self._shape: Shape | None = None

    @property
    def table_name(self) -> str:
        return self.collection

    def _error(self, exc: Exception) -> SinkError:
        if (missing := client_missing(exc, self.shown)) is not None:
            return missing
        # the client's errors only where it was imported: its import may be what failed
        errors = sys.modules.get("qdrant_client.http.exceptions")
        status = getattr(exc, "status_code", None)
        retryable = isinstance(exc, (ConnectionError, TimeoutError, OSError)) or (
            errors is not None
            and (
                isinstance(exc, errors.ResponseHandlingException)
                or (isinstance(exc, errors.UnexpectedResponse) and (status == 429 or (status or 0) >= 500))
            )
        )
        message = str(exc).strip() or type(exc).__name__
        if isinstance(exc, RuntimeError) and _BUSY in message:  # local mode: another client holds the folder
            return SinkError(
                f"Qdrant at {self.shown}: the folder is open in another process (local mode serves one at a "
                "time): try again later",
                retryable=True,
            )
        if self._api_key:
            message = message.replace(self._api_key, "***")
        return SinkError(f"Qdrant at {self.shown}: {message}", retryable)

    def _connect(self):
        from qdrant_client import QdrantClient

        if self._client is None:
            if isinstance(self._where, str):  # local: a folder's path
                self._client = QdrantClient(path=self._where)
            else:
                host, port = self._where
                self._client = QdrantClient(host=host, port=port, api_key=self._api_key, https=False, timeout=30)
        return self._client

    def _params(self, shape: Shape) -> tuple[dict, dict]:
        """(vectors_config, sparse_vectors_config) of a collection for ``shape``."""
        from qdrant_client import models

        if shape.output == "sparse":
            return {}, {_NAMES["sparse"]: models.SparseVectorParams()}
        if shape.form not in _DATATYPES:
            raise SinkError(
                f"Qdrant stores float32, float16 and uint8 vectors, not {shape.form}: store float32 (and "
                "turn on Qdrant's own binary or scalar quantization) or use another sink",
                retryable=False,
            )
        multi = (
            models.MultiVectorConfig(comparator=models.MultiVectorComparator.MAX_SIM)
            if shape.output == "multivector"
            else None
        )
        params = models.VectorParams(
            size=shape.dim,
            distance=models.Distance.COSINE,
            datatype=models.Datatype(shape.form),
            multivector_config=multi,
        )
        return {_NAMES[shape.output]: params}, {}

    def open(self, shape: Shape) -> None:
        dense, sparse = self._params(shape)
        self._shape = shape
        try:
            client = self._connect()
            if not client.collection_exists(self.collection):
                client.create_collection(self.collection, vectors_config=dense, sparse_vectors_config=sparse or None)
            config = client.get_collection(self.collection).config.params
        except Exception as exc:
            raise self._error(exc) from None
        found = (config.vectors if isinstance(config.vectors, dict) else {}) or {}
        found_sparse = config.sparse_vectors or {}
        name = _NAMES[shape.output]
        if shape.output == "sparse":
            fits = name in found_sparse
        else:
            have = found.get(name)
            fits = (
                have is not None
                and have.size == shape.dim
                and (have.multivector_config is None) == (shape.output != "multivector")
            )
        if not fits:
            raise SinkError(
                f"collection {self.collection} has no {name} vector of {shape.dim} dimensions: name another collection",
                retryable=False,
            )

    def attach(self) -> Shape:
        try:
            client = self._connect()
            if not client.collection_exists(self.collection):
                raise SinkError(
                    f"Qdrant at {self.shown}: no collection {self.collection}: load one first", retryable=False
                )
            config = client.get_collection(self.collection).config.params
            # a point's payload says whether the rows are chunks (a collection has no columns to say it)
            first = client.scroll(self.collection, limit=1, with_payload=True, with_vectors=False)[0]
        except SinkError:
            raise
        except Exception as exc:
            raise self._error(exc) from None
        chunked = bool(first) and "chunk" in (first[0].payload or {})
        vectors = config.vectors if isinstance(config.vectors, dict) else {}
        if (params := vectors.get(_NAMES["dense"])) is not None:
            datatype = params.datatype.value if params.datatype is not None else "float32"
            self._shape = Shape(datatype if datatype in _DATATYPES else "float32", "dense", params.size, chunked)
        elif (params := vectors.get(_NAMES["multivector"])) is not None:
            self._shape = Shape("float32", "multivector", params.size, chunked)
        elif _NAMES["sparse"] in (config.sparse_vectors or {}):
            self._shape = Shape("float32", "sparse", 0, chunked)  # a sparse vector's vocabulary is not recorded
        else:
            raise SinkError(
                f"collection {self.collection} has none of the vectors a load makes ({', '.join(_NAMES)})",
                retryable=False,
            )
        return self._shape

    def _vector(self, shape: Shape, value) -> Any:
        from qdrant_client import models

        if shape.output == "sparse":
            indices, values = value
            return {
                _NAMES["sparse"]: models.SparseVector(
                    indices=[int(i) for i in indices], values=[float(v) for v in values]
                )
            }
        return {_NAMES[shape.output]: np.asarray(value, dtype=np.float32).tolist()}

    def write(self, rows: Rows) -> None:
        from qdrant_client import models

        shape = self._shape
        assert shape is not None, "open() first"
        points = []
        for i, doc_id in enumerate(rows.ids):
            payload: dict[str, Any] = {"id": doc_id, "metadata": (rows.metadata[i] if rows.metadata else None) or {}}
            if rows.texts is not None and rows.texts[i] is not None:
                payload["text"] = rows.texts[i]
            chunk = None
            if shape.chunked:
                chunk, start, end = rows.chunks[i] if rows.chunks else (0, None, None)
                payload |= {"chunk": chunk, "start_char": start, "end_char": end}
            points.append(
                models.PointStruct(
                    id=point_id(doc_id, chunk), vector=self._vector(shape, rows.vectors[i]), payload=payload
                )
            )
        try:
            self._connect().upsert(self.collection, points=points, wait=True)
        except Exception as exc:
            raise self._error(exc) from None

    def finish(self) -> None:
        """Qdrant builds its HNSW index as points arrive: nothing to do after the load."""

    def count(self) -> int:
        try:
            return int(self._connect().count(self.collection, exact=True).count)
        except Exception as exc:
            raise self._error(exc) from None

    def search(self, vector: np.ndarray, top_k: int, where: dict[str, Any] | None = None) -> list[Hit]:
        """``vector``: float32 [dim] for a dense collection, or the query's token vectors [q, dim] for a
        collection of multi-vectors, which Qdrant ranks by its MAX_SIM comparator over cosines: the sum
        over the query's rows of the row's largest cosine with the point's vectors, the MaxSim (from -q to
        q), as POST /v1/rerank scores a multi-vector model. ``where``: metadata fields and the values they
        must equal."""
        from qdrant_client import models

        shape = self._shape
        assert shape is not None, "open() first"
        if shape.output == "sparse":
            raise SinkError(
                "search is served over dense vectors and multi-vectors: search a dense or multi-vector collection",
                retryable=False,
            )
        query = np.asarray(vector, np.float32)
        multi = shape.output == "multivector"
        if query.ndim != (2 if multi else 1):
            wanted = "the query's token vectors [tokens, dim]" if multi else "one vector [dim]"
            raise SinkError(
                f"collection {self.collection} holds {shape.output} vectors, searched by {wanted}: "
                f"a query of shape {list(query.shape)} was given",
                retryable=False,
            )
        condition = None
        if where:
            condition = models.Filter(
                must=[
                    models.FieldCondition(key=f"metadata.{k}", match=models.MatchValue(value=v))
                    for k, v in where.items()
                ]
            )
        try:
            found = (
                self._connect()
                .query_points(
                    self.collection,
                    query=query.tolist(),  # [dim] or [q, dim]: a multi-vector query is a list of vectors
                    using=_NAMES[shape.output],
                    limit=top_k,
                    query_filter=condition,
                    with_payload=True,
                )
                .points
            )
        except Exception as exc:
            raise self._error(exc) from None
        return [
            Hit(
                p.payload["id"],
                float(p.score),
                p.payload.get("metadata") or {},
                p.payload.get("chunk"),
                p.payload.get("text"),
            )
            for p in found
        ]

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()
