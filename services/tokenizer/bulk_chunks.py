"""A chunked job batch in the tokenizer: each document tokenized once, whole, cut into chunks
(services/tokenizer/chunking.py). The chunks' texts are never tokenized again: every sequence is a
slice of the document's tokens inside the frame (the special tokens and the prompt's before it, the
special tokens after). A result row is a chunk, whichever way its vector is made:

- plain chunking: each chunk a sequence of its own, embedded alone as any sequence;
- late chunking: the document's chunks grouped into windows of the model's room (shared/chunk_windows.py),
  each window ONE sequence carrying as spans (in its sequence positions) the chunks it owns; the
  worker reads the window in one forward and pools each span into a chunk's vector (output "spans").
  A document that fits the model is one window: one forward, however many chunks.
No NATS here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate, chain

import numpy as np

from embedfleet.services.tokenizer.bounded_cuts import chars_refusal, cuts
from embedfleet.services.tokenizer.chunking import chunk_ids
from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.services.tokenizer.metrics import BulkEncoder
from embedfleet.shared.chunk_windows import late_windows
from embedfleet.shared.config.registry import default
from embedfleet.shared.protocol import ChunkRows, JobBatch, Spans, row_bytes
from embedfleet.shared.text_chunks import TextChunk

# bytes a row adds to a token batch or a result besides its tokens or vector, its document id and its
# text: msgpack's headers of those, its five chunk numbers and its span (int32), its sequence length
_ROW_BYTES = 56


@dataclass(frozen=True, slots=True)
class CutBatch:
    """A job batch's documents as sequences and as result rows (a chunk each), both in document order;
    and the documents given up. Plain chunking: sequence i is row i. Late: sequence i is a window, and
    its ``spans`` are the rows it owns, in order (rows ``spans.offsets[i]`` .. ``spans.offsets[i + 1]``)."""

    sequences: list[list[int]]  # each sequence's token ids, framed
    chunks: ChunkRows  # which chunk of which document each row is
    doc_ids: list[str]  # each row's document id
    failed: list[tuple[int, str]]  # (document row, why) of the documents given up: no rows
    spans: Spans | None = None  # late chunking: per sequence, its rows' tokens, in sequence positions

    @property
    def rows(self) -> int:
        """Result rows: the job batch's chunks."""
        return len(self.doc_ids)

    def row_bounds(self) -> np.ndarray:
        """[sequences + 1] int64: sequence i makes rows ``[i]`` .. ``[i + 1]``."""
        return self.spans.offsets if self.spans is not None else np.arange(len(self.sequences) + 1, dtype=np.int64)

    def result_bytes(self, vector_bytes: int) -> int:
        """The bytes its rows take in the results stream, with vectors of ``vector_bytes``: as ``pack_rows``
        counts a row (its vector, numbers, document id and text)."""
        texts = self.chunks.texts
        return (
            self.rows * (vector_bytes + _ROW_BYTES)
            + sum(len(d.encode()) for d in self.doc_ids)
            + (sum(len(t.encode()) for t in texts) if texts is not None else 0)
        )

    def packed(self, rows: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """Sequences ``lo`` .. ``hi`` back to back: ([T] int32 token ids, [sequences + 1] int32 cu_seqlens)."""
        lo, hi = rows
        seqs = self.sequences[lo:hi]
        cu = np.array([0, *accumulate(map(len, seqs))], dtype=np.int32)
        return np.fromiter(chain.from_iterable(seqs), dtype=np.int32, count=int(cu[-1])), cu


class BatchCutter:
    """Cuts job batches for one model: a copy of its tokenizer made once reads each document whole. A
    document of more than ``max_chars`` characters is given up unread; the others are tokenized a group
    at a time (bounded_cuts.py), so a batch holds one group's encodings at once. A document of more than
    ``max_chunks`` chunks is given up, and so is one that takes the batch past ``max_chunks`` in all (the
    gateway and reindex fit batch sizes so that none does: shared/jobs/fit.py), so a batch's sequences
    are at most ``max_chunks`` however far its chunks overlap."""

    def __init__(
        self, encoder: TextEncoder | BulkEncoder, max_chunks: int, max_chars: int = default("max_document_chars")
    ) -> None:
        self._encoder = encoder
        self._tokenizer = encoder.whole_text_tokenizer()
        self._max_chunks = max_chunks
        self._max_chars = max_chars

    def cut(self, job: JobBatch) -> CutBatch:
        """Every document of ``job`` cut; ServiceError (the whole batch given up) for what no document
        can be cut for: a chunk over the room the model and the prompt leave; late chunking for a model
        whose special tokens do not frame a text plainly (its spans could not be placed)."""
        chunking = job.chunking
        assert chunking is not None  # the tokenizer cuts only a batch that asks for chunks
        room = self._encoder.room(job.options)
        chunking.spec.check_room(room)
        if chunking.late:
            self._encoder.frame_sizes(job.options)  # refuses a frame the spans cannot be placed past
        before, after = self._encoder.frame(job.options)
        sequences: list[list[int]] = []
        spans: list[list[tuple[int, int]]] = []  # late: per sequence, its chunks' (first, last) in it
        rows: list[tuple[int, int, int, int, int]] = []
        failed = [
            (d, f"document {job.doc_ids[d][:200]!r} {chars_refusal(len(text), self._max_chars)}")
            for d, text in enumerate(job.texts)
            if len(text) > self._max_chars
        ]
        readable = [d for d, text in enumerate(job.texts) if len(text) <= self._max_chars]
        total = 0  # the batch's chunks so far: at most max_chunks, as one request's
        for d, chunks in zip(readable, cuts(self._tokenizer, [job.texts[d] for d in readable], chunking.spec)):
            why = self._too_many(job.doc_ids[d], len(chunks), total)
            if why is not None:
                failed.append((d, why))
                continue
            total += len(chunks)
            if chunking.late:
                windows, owned = window_rows(chunks.ids, chunks, room, (before, after))
                sequences += windows
                spans += owned
            else:
                sequences += [[*before, *ids, *after] for ids in chunk_ids(chunks.ids, chunks)]
            rows += [(d, k, len(chunks), c.start, c.end) for k, c in enumerate(chunks)]
        texts = [job.texts[d][start:end] for d, _, _, start, end in rows] if chunking.with_text else None
        return CutBatch(
            sequences,
            ChunkRows.of(len(job.texts), rows, texts),
            [job.doc_ids[r[0]] for r in rows],
            sorted(failed),
            Spans.of(spans) if chunking.late else None,
        )

    def _too_many(self, doc_id: str, chunks: int, before: int) -> str | None:
        """Why a document cut into ``chunks`` is given up, ``before`` chunks of its batch ahead of it
        (None: it is not)."""
        name = repr(doc_id[:200])
        if chunks > self._max_chunks:
            return (
                f"document {name} is cut into {chunks} chunks, over the {self._max_chunks} a document may be (the "
                "tokenizer's --max-chunks): give a larger chunk size, or cut the document"
            )
        if before + chunks > self._max_chunks:
            return (
                f"document {name} is cut into {chunks} chunks, which take its job batch past the {self._max_chunks} "
                f"a batch may be cut into (the tokenizer's --max-chunks; {before} before it): give a smaller batch "
                "size or a larger chunk size"
            )
        return None


def over_budget(batch: CutBatch, vector_bytes: int, before: int, budget: int) -> str | None:
    """Why a job's chunked ``batch`` is given up, ``before`` chunks of its job cut ahead of it (each counted
    at this batch's bytes a chunk): its results would take the job past ``budget`` bytes, what one job may
    store (--job-max-result-bytes; 0: no limit). None: within it."""
    if not budget or not batch.rows:
        return None
    size = batch.result_bytes(vector_bytes)
    total = before * -(-size // batch.rows) + size
    if total <= budget:
        return None
    return (
        f"its {batch.rows} chunks would take the job's results to some {total:,} bytes ({before + batch.rows:,} "
        f"chunks), over the {budget:,} one job may store (the tokenizer's --job-max-result-bytes): give a larger "
        "chunk size, or fewer documents a job"
    )


def window_rows(
    ids: list[int], chunks: list[TextChunk], room: int, frame: tuple[list[int], list[int]]
) -> tuple[list[list[int]], list[list[tuple[int, int]]]]:
    """A document's late windows (``late_windows`` of its ``chunks``, each at most ``room`` tokens) as
    sequences: the ``frame`` (tokens before, after) around the window's slice of the document's token
    ``ids``; with each window the (first, last) of the chunks it owns, in its sequence's positions. A
    chunk of no tokens (a document without any) pools its whole sequence, as the online path does."""
    before, after = frame
    sequences, owned = [], []
    for w in late_windows(chunks, room):
        base = chunks[w.first].first  # the window's first token, in the document's tokens
        sequence = [*before, *ids[base : chunks[w.end - 1].last], *after]
        sequences.append(sequence)
        owned.append(
            [
                (len(before) + c.first - base, len(before) + c.last - base) if c.tokens else (0, len(sequence))
                for c in chunks[w.own : w.end]
            ]
        )
    return sequences, owned


def pack_rows(
    batch: CutBatch, max_tokens: int, max_seqs: int, max_bytes: int, vector_bytes: int
) -> Iterator[tuple[int, int]]:
    """``batch``'s sequences, in order, as token batches [lo, hi) of at most ``max_tokens`` tokens,
    ``max_seqs`` sequences and ``max_bytes`` bytes, whichever the batch or its result would take (a
    sequence's tokens, or the vectors of ``vector_bytes`` of the rows it makes, with their document ids
    and texts): a sequence alone may pass the first and last."""
    texts = batch.chunks.texts
    bounds = batch.row_bounds().tolist()
    lo, n = 0, len(batch.sequences)
    while lo < n:
        hi, tokens, size = lo, 0, 0
        while hi < n and hi - lo < max_seqs:
            length = len(batch.sequences[hi])
            a, b = bounds[hi], bounds[hi + 1]  # the rows it makes: one, or a window's chunks
            cost = (
                max(4 * length, vector_bytes * (b - a))
                + (b - a) * _ROW_BYTES
                + sum(len(d.encode()) for d in batch.doc_ids[a:b])
                + (sum(len(t.encode()) for t in texts[a:b]) if texts is not None else 0)
            )
            if hi > lo and (tokens + length > max_tokens or size + cost > max_bytes):
                break
            tokens, size, hi = tokens + length, size + cost, hi + 1
        yield lo, hi
        lo = hi


def vector_bytes(options, dim: int) -> int:
    """The most bytes a row's vector takes in a result (the model's dimension in the asked form)."""
    return row_bytes(options.dtype, options.dimensions or dim)
