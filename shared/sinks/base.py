"""What a sink is: where a re-index job's rows go besides files (a vector store), and the rows it takes.

A sink is written by the stage that collects a job's results (never by a worker), in batches, each
batch an upsert keyed by the document's id (and the chunk's number when the job chunks): a batch
delivered twice, after a crash or a redelivery, writes nothing twice. Sinks are synchronous (their
clients are): the collector calls them in a thread. A failure raises ``SinkError`` with the store's
own message, marked retryable when waiting may help (the store down or busy), so the job pauses and
tries again instead of failing.

The gateway's ``POST /v1/search`` reads a loaded table through the same sink: ``attach`` (the table
as a load left it), then ``search``, in a thread too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from embedfleet.shared.extras import MissingExtra, missing_extra


class SinkError(Exception):
    """A store refused or failed a call. ``retryable``: the store may take it later (down, busy,
    full), as opposed to a request it will never take (a table of another dimension, a bad URL)."""

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class ClientMissing(SinkError):
    """The store's client library (``module``) is not installed here: the extra 'sinks' installs it.
    ``shown``: the sink's URL as shown."""

    def __init__(self, module: str, shown: str) -> None:
        super().__init__(str(MissingExtra(module, f"the sink {shown}")), retryable=False)
        self.module, self.shown = module, shown


def client_missing(exc: Exception, shown: str) -> ClientMissing | None:
    """``exc`` as a ClientMissing, when it is the import of a store's client failing (None: another failure)."""
    if isinstance(exc, ModuleNotFoundError) and missing_extra(exc, shown) is not None:
        return ClientMissing((exc.name or "").partition(".")[0], shown)
    return None


@dataclass(frozen=True, slots=True)
class Shape:
    """What a job's rows are. ``form``: shared/vectors/forms.py's (float32, float16, int8, uint8, binary,
    ubinary); ``output``: dense, sparse or multivector; ``dim``: components of a vector (a sparse
    output's vocabulary size); ``chunked``: rows are chunks of documents (id, chunk, start, end)."""

    form: str
    output: str
    dim: int
    chunked: bool = False


@dataclass(frozen=True, slots=True)
class Rows:
    """One batch of a job's rows. ``vectors``: dense [n, width] in the job's form; sparse a list of
    (indices, values); multivector a list of [tokens, width] float arrays. ``metadata``: per row the
    input's other fields (or None). ``chunks``: per row (chunk, start, end) when the job chunks.
    ``texts``: per row the text its vector was made from (the chunk's, when the job chunks), kept so a
    search can answer it and a reranker score it (or None: not kept)."""

    ids: list[str]
    vectors: np.ndarray | list
    metadata: list[dict[str, Any] | None] | None = None
    chunks: list[tuple[int, int, int]] | None = None
    texts: list[str | None] | None = None

    def __post_init__(self) -> None:
        for name in ("metadata", "chunks", "texts"):
            column = getattr(self, name)
            if column is not None and len(column) != len(self.ids):
                raise ValueError(f"{len(column)} {name} for {len(self.ids)} rows")
        if len(self.vectors) != len(self.ids):
            raise ValueError(f"{len(self.vectors)} vectors for {len(self.ids)} rows")


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result: the row's id (and chunk), its similarity to the query (higher is closer;
    cosine for dense float rows), its metadata and its text (None: the row has none stored)."""

    id: str
    score: float
    metadata: dict[str, Any] = field(default_factory=dict)
    chunk: int | None = None
    text: str | None = None


class Sink(Protocol):
    shown: str  # the sink's URL with any password replaced by ***: what logs and job states show

    @property
    def table_name(self) -> str:
        """The table (Qdrant: collection) its rows go to, as the URL names it."""
        ...

    def open(self, shape: Shape) -> None:
        """Connects, and makes the table (collection) when missing; SinkError when an existing one
        cannot take ``shape`` (another dimension or type)."""

    def write(self, rows: Rows) -> None:
        """Upserts one batch, durably when it returns."""

    def attach(self) -> Shape:
        """Connects to the table (collection) a load made, to search it, and returns what its rows are;
        SinkError (not retryable) when there is none: a search never makes an empty one."""

    def finish(self) -> None:
        """After the last batch: builds the search index where the store wants one built after a load."""

    def count(self) -> int:
        """Rows the store holds in the table."""

    def search(self, vector: np.ndarray, top_k: int, where: dict[str, Any] | None = None) -> list[Hit]:
        """The ``top_k`` rows closest to ``vector`` (float32 [dim]); ``where``: metadata fields that
        must equal the given values."""

    def close(self) -> None: ...
