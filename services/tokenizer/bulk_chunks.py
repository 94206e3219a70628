"""A chunked job batch in the tokenizer: each document tokenized once, whole, cut into windows
(services/tokenizer/chunking.py), and each window made a sequence of its own (the special tokens and
the prompt's before its tokens, the special tokens after), sent to the workers as any sequence. The
chunks' texts are never tokenized again: their tokens are slices of the document's. No NATS here.

Late chunking (the whole document in one forward, the token vectors pooled over each window) plugs
in at ``BatchCutter.cut``: there a document would become one sequence (the frame around its first
tokens, up to the model's limit) with the windows as token spans within it, the rows of its
TokenChunk being its spans and the worker pooling each span into a vector. Until workers pool
spans, a batch asking for it is refused (``LATE_NOT_SERVED``).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate, chain
from typing import Iterator

import numpy as np

from shared.errors import ErrorCode, ServiceError
from shared.protocol import ChunkRows, JobBatch, row_bytes
from shared.text_chunks import LATE_NOT_SERVED
from services.tokenizer.chunking import chunk_ids, cut
from services.tokenizer.encoder import TextEncoder, encode_all

# bytes a row adds to a token batch or a result besides its tokens or vector, its document id and its
# text: msgpack's headers of those, its five chunk numbers (int32), its sequence length
_ROW_BYTES = 48


@dataclass(frozen=True, slots=True)
class CutBatch:
    """A job batch's documents as rows, a chunk each, in document order; and the documents given up."""

    sequences: list[list[int]]  # each row's token ids, framed
    chunks: ChunkRows  # which chunk of which document each row is
    doc_ids: list[str]  # each row's document id
    failed: list[tuple[int, str]]  # (document row, why) of the documents given up: no rows

    def packed(self, rows: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``lo`` .. ``hi`` back to back: ([T] int32 token ids, [rows + 1] int32 cu_seqlens)."""
        lo, hi = rows
        seqs = self.sequences[lo:hi]
        cu = np.array([0, *accumulate(map(len, seqs))], dtype=np.int32)
        return np.fromiter(chain.from_iterable(seqs), dtype=np.int32, count=int(cu[-1])), cu


class BatchCutter:
    """Cuts job batches for one model: a copy of its tokenizer made once reads each document whole."""

    def __init__(self, encoder: TextEncoder, max_chunks: int) -> None:
        self._encoder = encoder
        self._tokenizer = encoder.whole_text_tokenizer()
        self._max_chunks = max_chunks

    def cut(self, job: JobBatch) -> CutBatch:
        """Every document of ``job`` cut; ServiceError (the whole batch given up) for what no document
        can be cut for: late chunking, a window over the room the model and the prompt leave."""
        chunking = job.chunking
        if chunking.late:  # the plug for late chunking (see the module's docstring)
            raise ServiceError(ErrorCode.INVALID_REQUEST, LATE_NOT_SERVED)
        chunking.spec.check_room(self._encoder.room(job.options))
        before, after = self._encoder.frame(job.options)
        encodings = encode_all(self._tokenizer, job.texts, add_special_tokens=False)
        sequences: list[list[int]] = []
        rows: list[tuple[int, int, int, int, int]] = []
        failed: list[tuple[int, str]] = []
        for d, (text, encoding) in enumerate(zip(job.texts, encodings)):
            chunks = cut(text, encoding, chunking.spec)
            if len(chunks) > self._max_chunks:
                failed.append((d, f"document {job.doc_ids[d][:200]!r} is cut into {len(chunks)} chunks, over the "
                                  f"{self._max_chunks} a document may be (the tokenizer's --max-chunks): give a larger "
                                  "chunk size, or cut the document"))
                continue
            sequences += [[*before, *ids, *after] for ids in chunk_ids(encoding.ids, chunks)]
            rows += [(d, k, len(chunks), c.start, c.end) for k, c in enumerate(chunks)]
        texts = [job.texts[d][start:end] for d, _, _, start, end in rows] if chunking.with_text else None
        return CutBatch(sequences, ChunkRows.of(len(job.texts), rows, texts), [job.doc_ids[r[0]] for r in rows], failed)


def pack_rows(batch: CutBatch, max_tokens: int, max_seqs: int, max_bytes: int, vector_bytes: int
              ) -> Iterator[tuple[int, int]]:
    """``batch``'s rows, in order, as token batches [lo, hi) of at most ``max_tokens`` tokens, ``max_seqs``
    rows and ``max_bytes`` bytes, whichever the batch or its result would take (a row's tokens, or its
    vector of ``vector_bytes``, with its document id and text): a row alone may pass the first and last."""
    texts = batch.chunks.texts
    lo, n = 0, len(batch.sequences)
    while lo < n:
        hi, tokens, size = lo, 0, 0
        while hi < n and hi - lo < max_seqs:
            length = len(batch.sequences[hi])
            cost = (max(4 * length, vector_bytes) + len(batch.doc_ids[hi].encode()) + _ROW_BYTES
                    + (len(texts[hi].encode()) if texts is not None else 0))
            if hi > lo and (tokens + length > max_tokens or size + cost > max_bytes):
                break
            tokens, size, hi = tokens + length, size + cost, hi + 1
        yield lo, hi
        lo = hi


def vector_bytes(options, dim: int) -> int:
    """The most bytes a row's vector takes in a result (the model's dimension in the asked form)."""
    return row_bytes(options.dtype, options.dimensions or dim)
