"""Spans: token ranges of a request's rows, each pooled into one vector (the output "spans": late chunking).

Row i owns spans ``offsets[i]:offsets[i + 1]`` (``offsets``: the cumulative ``counts``); span j covers
tokens ``[firsts[j], lasts[j])`` of its row. Two frames, one per message that carries spans:

- an EmbedRequest's rows are texts, and a span counts the text's content tokens (no special tokens, no
  prompt), as a ChunkLayout counts a chunk's; ``tokens`` says how many content tokens each text makes,
  so the tokenizer can tell a text that tokenizes otherwise. A text without tokens has one empty span
  (0, 0). Keys ``cc``, ``cf``, ``cl``, ``ct``: the ChunkLayout's, in the same meaning.
- a TokenChunk's rows are token sequences, and a span counts the sequence's tokens (the tokenizer has
  shifted each span past the special tokens and the prompt before it). Keys ``sn``, ``sf``, ``sl``.

Everything read from the wire is checked before it is used (``span_fault``), by the decoders and again
by the engine, which takes spans from any caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedfleet.shared.protocol.checks import MAX_ROWS, TOKEN_DTYPE, ProtocolError, int32_array, required

CONTENT_KEYS = ("cc", "cf", "cl", "ct")  # counts, firsts, lasts, tokens: an EmbedRequest's
SEQUENCE_KEYS = ("sn", "sf", "sl")  # counts, firsts, lasts: a TokenChunk's


@dataclass(frozen=True, slots=True)
class Spans:
    counts: np.ndarray  # [rows] int32: spans of each row
    firsts: np.ndarray  # [spans] int32: each span's first token within its row
    lasts: np.ndarray  # [spans] int32: each span's end (exclusive)
    tokens: np.ndarray | None = None  # [rows] int32: content tokens each row's text makes (an EmbedRequest's)

    @classmethod
    def of(cls, rows: Sequence[Sequence[tuple[int, int]]], tokens: Sequence[int] | None = None) -> Spans:
        """Spans from each row's (first, last) pairs."""
        flat = [pair for row in rows for pair in row]
        bounds = np.array(flat, dtype=TOKEN_DTYPE).reshape(-1, 2)
        return cls(
            np.array([len(row) for row in rows], TOKEN_DTYPE),
            bounds[:, 0].copy(),
            bounds[:, 1].copy(),
            None if tokens is None else np.array(tokens, TOKEN_DTYPE),
        )

    @property
    def rows(self) -> int:
        return len(self.counts)

    @property
    def offsets(self) -> np.ndarray:
        """[rows + 1] int64: row i's spans are ``offsets[i]:offsets[i + 1]``."""
        out = np.zeros(len(self.counts) + 1, dtype=np.int64)
        np.cumsum(self.counts, out=out[1:])
        return out

    def take(self, rows: Sequence[int] | np.ndarray) -> Spans:
        """The spans of ``rows`` (in that order), as the spans of a request of those rows alone."""
        rows = np.asarray(rows, dtype=np.int64)
        offsets = self.offsets
        counts = self.counts[rows]
        # each taken span's index in the whole: its row's first span, plus its place within the row
        starts = np.repeat(offsets[rows], counts)
        within = np.arange(len(starts), dtype=np.int64) - np.repeat(np.cumsum(counts, dtype=np.int64) - counts, counts)
        pick = starts + within
        return Spans(
            counts.copy(), self.firsts[pick], self.lasts[pick], None if self.tokens is None else self.tokens[rows]
        )

    def between(self, start: int, end: int) -> Spans:
        """The spans of the consecutive rows ``start`` .. ``end`` (a token chunk's)."""
        offsets = self.offsets
        a, b = int(offsets[start]), int(offsets[end])
        return Spans(
            self.counts[start:end],
            self.firsts[a:b],
            self.lasts[a:b],
            None if self.tokens is None else self.tokens[start:end],
        )

    def to_wire(self, keys: tuple[str, ...]) -> dict[str, bytes]:
        arrays = (self.counts, self.firsts, self.lasts, self.tokens)
        return {key: np.ascontiguousarray(a, dtype=TOKEN_DTYPE).tobytes() for key, a in zip(keys, arrays)}


def span_fault(
    counts: np.ndarray,
    firsts: np.ndarray,
    lasts: np.ndarray,
    lengths: np.ndarray,
    empty_rows: bool = False,
    least: int = 1,
) -> tuple[int | None, str] | None:
    """What is wrong with spans of rows ``lengths`` tokens long, as (the row at fault or None, what), or None.

    Each row has at least ``least`` spans and at most as many as it has tokens; each span is 0 <= first <
    last <= its row's length. ``empty_rows``: a row of no tokens has one empty span (0, 0) (an EmbedRequest's
    text without tokens). Lengths are checked first: nothing is allocated from a count before its total is known.
    """
    rows = len(lengths)
    if len(counts) != rows:
        return None, f"spans: one count per row ({rows}), got {len(counts)}"
    # the sum in int64: int32 counts could wrap around to the spans' number
    total = int(counts.sum(dtype=np.int64)) if rows else 0
    if len(firsts) != len(lasts) or total != len(firsts) or total > MAX_ROWS:
        return None, f"spans: the counts sum to the spans, at most {MAX_ROWS}, each with a first and a last"
    if rows and counts.min() < least:
        return int(np.argmax(counts < least)), "has no span" if least else "has a negative count of spans"
    widths = np.maximum(lengths.astype(np.int64), 1 if empty_rows else 0)
    if rows and np.any(counts > widths):
        return int(np.argmax(counts > widths)), "has more spans than tokens"
    row_of = np.repeat(np.arange(rows), counts)
    own = lengths.astype(np.int64)[row_of]
    empty = (firsts == 0) & (lasts == 0) & (own == 0) if empty_rows else np.zeros(len(firsts), dtype=bool)
    bad = (firsts < 0) | (lasts > own) | ((firsts >= lasts) & ~empty)
    if bad.any():
        j = int(np.argmax(bad))
        return int(row_of[j]), (
            f"has a span [{int(firsts[j])}, {int(lasts[j])}) outside its {int(own[j])} tokens "
            "or empty (0 <= first < last <= tokens)"
        )
    return None


def read_spans(m: dict, keys: tuple[str, ...], lengths: np.ndarray | None) -> Spans:
    """Spans from ``m``'s ``keys``, checked against rows ``lengths`` tokens long (None: the rows'
    ``tokens`` that the keys carry, an EmbedRequest's); ProtocolError when they do not fit."""
    arrays = [int32_array(required(m, key, bytes), key) for key in keys]
    counts, firsts, lasts = arrays[:3]
    tokens = arrays[3] if len(arrays) > 3 else None
    if tokens is not None:
        if len(tokens) != len(counts) or (len(tokens) and tokens.min() < 0):
            raise ProtocolError("spans: one content-token count per row, each >= 0")
        lengths = tokens
    assert lengths is not None, "spans without their tokens are read against given row lengths"
    fault = span_fault(counts, firsts, lasts, lengths, empty_rows=tokens is not None)
    if fault is not None:
        row, what = fault
        raise ProtocolError(what if row is None else f"spans: row {row} {what}")
    return Spans(counts, firsts, lasts, tokens)


def spans_field(m: dict, keys: tuple[str, ...], output: str, lengths: np.ndarray | None) -> Spans | None:
    """A message's spans: present exactly when its options ask for output "spans"."""
    present = [key for key in keys if m.get(key) is not None]
    if output != "spans":
        if present:
            raise ProtocolError("spans come only with output 'spans'")
        return None
    return read_spans(m, keys, lengths)


def spans_body(spans: Spans | None, keys: tuple[str, ...]) -> dict[str, Any]:
    return {} if spans is None else spans.to_wire(keys)
