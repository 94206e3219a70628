"""A long text cut into windows of at most ``size`` content tokens (chunking, late chunking). No NATS here.

The input is one ``tokenizers.Encoding`` of the whole text, made without special tokens and without
truncation by ``whole_text_tokenizer``'s copy of the model's tokenizer; every chunk is a slice of its
tokens (of its pieces' own inside a word longer than a chunk, below), with the characters it spans.

Rules:
- Cuts fall between pre-tokenizer words (``Encoding.word_ids``): the tokenizer's model (WordPiece,
  BPE, Unigram) works on each word alone, so the tokens of ``text[start:end]`` tokenized alone are
  exactly the chunk's. A word here is what the model's pre-tokenizer makes one: for BERT's, a run of
  letters and digits, each punctuation mark and each CJK character on its own; for Metaspace
  (SentencePiece) a run between spaces; for byte-level BPE a regex piece. Never right after a token
  that is all whitespace: byte-level BPE splits a run of whitespace by what follows it (GPT-2's regex
  makes "\\n\\n\\nLine" "\\n\\n", "\\n", "Line", but keeps "\\n\\n\\n" at a text's end whole), so a chunk
  ends before such a run.
- A chunk's text runs from its first token's first character to its last token's last character,
  and over characters no token covers that touch them (an accent the normalizer dropped): whitespace
  around it is left out where the tokenizer's offsets leave it out (BERT's do; a byte-level token that
  carries its leading space keeps it, as its re-tokenization needs: RoBERTa's post-processor would trim
  it, hence ``whole_text_tokenizer``). Not kept: a pre-tokenizer that adds a space before every text
  (``add_prefix_space``) re-tokenizes a chunk's first word differently where no space came before it;
  the chunk's ids are still the slice's.
- A window holds ``size`` tokens and ends at its last word start that follows whitespace, when that
  keeps the chunk at least half full ("e.g." and "https://x.org/a" stay whole); else at its last word
  start (a punctuation mark, a CJK character).
- A word of more than ``size`` tokens (WordPiece: a run of letters and digits of many pieces;
  SentencePiece: also CJK text, which has no spaces; byte-level BPE: a long run of punctuation) is cut
  into pieces, each the longest from its start whose text tokenizes alone to at most ``size`` tokens
  (checked by tokenizing it: inside a word the pieces' tokens are not the word's, a WordPiece "##x" reads
  "x" alone), and the chunks count those pieces' own tokens (``Chunks.ids``). A piece's edge inside the
  word is a wall: chunks end and start there, never hold one inside, and so do not overlap across it.
  So every chunk's text alone tokenizes to exactly its ids, at most ``size`` of them; more only where a
  single character alone makes more (a byte-level tokenizer's emoji of four bytes, ``size`` under 4).
- ``boundary="sentence"``: the window ends first of all at its last sentence end, when there is one
  that keeps the chunk at least half full (an earlier one would make chunks far under ``size``, and
  more of them); otherwise it ends as with ``"token"``. A sentence ends at a line break; after
  ``.``, ``!``, ``?``, ``…`` (or the Devanagari and Arabic stops ``।``, ``؟``, ``۔``; closing quotes
  and brackets after it included) followed by whitespace; after a full-width ``。``, ``！`` or ``？``,
  which need none. "e.g. x" reads as a sentence end: the cost is one early cut, no lost text.
- Overlap: the next window starts at the first word start (after whitespace where there is one) at
  most ``overlap`` tokens before the previous chunk's end, so consecutive chunks share at most
  ``overlap`` tokens; fewer where words are long, or where a window started there could not hold the
  word after the previous chunk whole. Each chunk starts and ends after the one before.
- A text with no tokens (empty, whitespace, characters the normalizer drops) is one chunk (0, 0) of
  no tokens: the service embeds it as it would without chunking.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from itertools import pairwise

from tokenizers import Encoding, Tokenizer

from embedfleet.shared.text_chunks import BOUNDARIES, ChunkSpec, TextChunk

# the request's parameters and a chunk's place live in shared/ (the gateway and the protocol read them too)
__all__ = [
    "BOUNDARIES",
    "ChunkSpec",
    "Chunks",
    "TextChunk",
    "chunk_ids",
    "chunked_tokens",
    "cut",
    "frame",
    "whole_text_tokenizer",
]

# a sentence ends after a stop and whitespace, a full-width stop (CJK text has no spaces) or a line
# break; closing quotes and brackets may follow a stop: `He said "no." Then`
_SENTENCE_END = re.compile(r"(?:[.!?…।؟۔][\"')\]}»”’」』]*\s+|[。！？][\"')\]}»”’」』]*\s*|[\n\r]\s*)")
_LOOK_AHEAD = 64  # characters of whitespace read past a token's start for the next word's first character


def whole_text_tokenizer(tokenizer: Tokenizer) -> Tokenizer:
    """A copy of ``tokenizer`` for the encoding ``cut`` reads: no truncation, no padding, and no
    post-processor, which adds nothing without special tokens but may trim offsets (RoBERTa's
    ``trim_offsets`` leaves out the space a byte-level token carries, and a chunk's text needs it)."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    copy.post_processor = None
    return copy


def frame(tokenizer: Tokenizer, prompt: str) -> tuple[list[int], list[int]]:
    """The tokens a chunk's content tokens go between to make a sequence, as ``tokenizer`` (the model's,
    with its post-processor) frames a text: its special tokens before the text and the ``prompt``'s
    tokens, and its special tokens after. A sequence made so is the one the chunk's text, with the
    prompt before it, tokenizes to, where the prompt ends between two words ("query: ", "passage: ")."""
    marked = tokenizer.encode("a", add_special_tokens=True)
    mask = marked.special_tokens_mask
    lead = next((i for i, special in enumerate(mask) if not special), len(mask))
    tail = next((i for i, special in enumerate(reversed(mask)) if not special), 0)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False).ids if prompt else []
    return [*marked.ids[:lead], *prompt_ids], marked.ids[len(mask) - tail :]


def cut(text: str, encoding: Encoding, spec: ChunkSpec, tokenizer: Tokenizer | None = None) -> Chunks:
    """``text`` cut into chunks, in order, covering every token. ``encoding`` is the whole text's,
    ``whole.encode(text, add_special_tokens=False)`` where ``whole`` is ``whole_text_tokenizer(...)``'s copy;
    ``tokenizer`` is that copy, which tokenizes the pieces of a word longer than ``size`` alone (needed
    only where the text has such a word: ValueError without it then)."""
    offsets = encoding.offsets  # a list made anew at each read: read once
    if not offsets:
        return Chunks([TextChunk(0, 0, 0, 0)], [])
    seq = _Sequence.of(text, encoding, offsets, spec, tokenizer)
    cuts = _Cuts(seq, spec)
    n = len(seq.offsets)
    chunks = Chunks([], seq.ids)
    first = last = 0
    while True:
        last = n if n - first <= spec.size and cuts.next_wall(first) >= n else cuts.end(first, last)
        chunks.append(TextChunk(*seq.span(text, first, last), first, last))
        if last == n:
            return chunks
        first = cuts.next_start(first, last)


class Chunks(list[TextChunk]):
    """A text's chunks, in order, with ``ids``: the token ids their ``first`` and ``last`` index. Those are
    the whole text's, except inside a word longer than ``size``, where they are its pieces' own."""

    def __init__(self, chunks: list[TextChunk], ids: list[int] | Encoding) -> None:
        super().__init__(chunks)
        self._ids = ids  # the whole text's Encoding until read: most callers need none of its ids

    @property
    def ids(self) -> list[int]:
        if isinstance(self._ids, Encoding):
            self._ids = self._ids.ids
        return self._ids


class _Sequence:
    """The tokens chunks index, and where they may be cut (sorted token indices i: a cut before token i).

    The whole text's tokens, but a word of more than ``size`` tokens is cut into pieces that each
    tokenize alone to at most ``size`` tokens (verified: the longest such piece found from its start),
    its tokens being its pieces' own. A piece's edge inside its word is a wall: a chunk may end or start
    there, and never holds one inside (the pieces joined would tokenize as the word, not as the pieces).
    """

    def __init__(self, ids: list[int] | Encoding, offsets: list[tuple[int, int]]) -> None:
        self.ids, self.offsets = ids, offsets
        self.spaced: list[int] = []  # word starts after whitespace: preferred, a word keeps its punctuation
        self.words: list[int] = []  # before the first token of a word, or at a wall
        self.clean: list[int] = []  # between two characters, not inside a word of pieces
        self.sentences: list[int] = []  # word starts that end a sentence, when asked for
        self.walls: list[int] = []
        self.wall_chars: dict[int, int] = {}  # wall -> the character its piece starts at

    @classmethod
    def of(
        cls,
        text: str,
        encoding: Encoding,
        offsets: list[tuple[int, int]],
        spec: ChunkSpec,
        tokenizer: Tokenizer | None,
    ) -> _Sequence:
        word_ids = encoding.word_ids
        seq = cls(encoding, offsets)
        starts = _sentence_starts(text) if spec.boundary == "sentence" else set()
        for i in range(1, len(offsets)):
            if offsets[i][0] < offsets[i - 1][1]:
                continue  # one character's bytes (byte-level BPE): no character boundary to cut at
            seq.clean.append(i)
            if word_ids[i] == word_ids[i - 1] or _blank(text, offsets[i - 1]):
                continue  # not after a whitespace token: byte-level BPE splits a whitespace run by what follows it
            seq.words.append(i)
            if _after_space(text, offsets[i]):
                seq.spaced.append(i)
            if starts and _text_start(text, offsets[i][0]) in starts:
                seq.sentences.append(i)
        long = [(a, b) for a, b in pairwise([0, *seq.words, len(offsets)]) if b - a > spec.size]
        if not long:
            return seq
        if tokenizer is None:
            raise ValueError("a word longer than the chunk is cut into pieces tokenized alone: pass the tokenizer")
        return seq._pieced(text, long, spec.size, tokenizer)

    def _pieced(self, text: str, long: list[tuple[int, int]], size: int, tokenizer: Tokenizer) -> _Sequence:
        """This sequence with each word [a, b) of ``long`` replaced by its pieces' tokens."""
        whole = self.ids.ids if isinstance(self.ids, Encoding) else self.ids
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        moved = [0] * (len(whole) + 1)  # a kept cut point's new index: i + moved[i]
        inside = [False] * (len(whole) + 1)  # cut points inside a long word: gone
        walls: list[int] = []
        wall_chars: dict[int, int] = {}
        done = 0
        for a, b in long:
            ids += whole[done:a]
            offsets += self.offsets[done:a]
            for i in range(done, a + 1):
                moved[i] = len(ids) - a
            for k, (start, piece) in enumerate(_pieces(text, self.offsets, a, b, size, tokenizer)):
                if k:
                    walls.append(len(ids))
                    wall_chars[len(ids)] = start
                ids += piece.ids
                offsets += [(start + x, start + y) for x, y in piece.offsets]
            for i in range(a + 1, b):
                inside[i] = True
            moved[b] = len(ids) - b
            done = b
        tail = len(ids) - done
        ids += whole[done:]
        offsets += self.offsets[done:]
        for i in range(done, len(whole) + 1):
            moved[i] = tail
        seq = _Sequence(ids, offsets)
        seq.walls, seq.wall_chars = walls, wall_chars
        for name in ("spaced", "words", "clean", "sentences"):
            kept = [i + moved[i] for i in getattr(self, name) if not inside[i]]
            if name in ("words", "clean"):
                kept = sorted([*kept, *walls])
            setattr(seq, name, kept)
        return seq

    def span(self, text: str, first: int, last: int) -> tuple[int, int]:
        """The characters of tokens [first, last) (a wall's, at its piece's edge), widened over the
        characters next to them that no token covers and are not whitespace (an accent or a vowel sign the
        normalizer dropped: "cafe\\u0301"'s token is "cafe"), so that a chunk's text holds its words whole.
        Such characters before the first token are its own only after whitespace: touching the previous
        token, they are that token's (NFKC composes "e\\u0301" into one character, whose offsets may leave
        out the accent)."""
        offsets = self.offsets
        if last in self.wall_chars:
            end = self.wall_chars[last]
        else:
            end = offsets[last - 1][1]
            ceiling = offsets[last][0] if last < len(offsets) else len(text)
            while end < ceiling and not text[end].isspace():
                end += 1
        if first in self.wall_chars:
            return self.wall_chars[first], end
        start = offsets[first][0]
        floor, at = (offsets[first - 1][1] if first > 0 else 0), start
        while at > floor and not text[at - 1].isspace():
            at -= 1
        return (at if at == 0 or text[at - 1].isspace() else start), end


def _pieces(
    text: str, offsets: list[tuple[int, int]], a: int, b: int, size: int, tokenizer: Tokenizer
) -> list[tuple[int, Encoding]]:
    """The word of tokens [a, b) cut into pieces, each (its first character, its encoding alone), each of
    at most ``size`` tokens: from each piece's start, the longest that fits, ending where a token of the
    whole text begins (found by bisection, each candidate tokenized alone); where even one token's
    characters make more alone, the longest run of its characters that fits; a single character that
    alone makes more than ``size`` tokens (a byte-level tokenizer's emoji) is a piece of its own."""
    stop = offsets[b - 1][1]
    ends = [offsets[j][0] for j in range(a + 1, b) if offsets[j][0] >= offsets[j - 1][1]] + [stop]
    pieces = []
    start = offsets[a][0]
    while start < stop:
        k = bisect_right(ends, start)
        # a piece's count grows with its length, near enough to bisect; every piece taken is checked
        fit = _longest(text, start, ends[k : k + size], size, tokenizer)
        if fit is None:  # one token's characters make more than size alone
            fit = _longest(text, start, list(range(start + 1, ends[k])), size, tokenizer)
        if fit is None:
            fit = start + 1, tokenizer.encode(text[start : start + 1], add_special_tokens=False)
        end, encoding = fit
        pieces.append((start, encoding))
        start = end
    return pieces


def _longest(text: str, start: int, ends: list[int], size: int, tokenizer: Tokenizer) -> tuple[int, Encoding] | None:
    """The last of ``ends`` whose text from ``start`` tokenizes alone to 1 .. ``size`` tokens, by bisection."""
    found = None
    lo, hi = 0, len(ends) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        encoding = tokenizer.encode(text[start : ends[mid]], add_special_tokens=False)
        if len(encoding.ids) <= size:
            if encoding.ids:
                found = ends[mid], encoding
            lo = mid + 1
        else:
            hi = mid - 1
    return found


def chunk_ids(ids: list[int], chunks: list[TextChunk]) -> list[list[int]]:
    """Each chunk's token ids: slices of ``ids`` (``Chunks.ids``), no tokenizing again."""
    return [ids[c.first : c.last] for c in chunks]


def chunked_tokens(chunks: list[TextChunk]) -> int:
    """Content tokens the chunks hold in all: a token shared by an overlap counts in each chunk."""
    return sum(c.tokens for c in chunks)


class _Cuts:
    """Where a window ends and the next starts, over a ``_Sequence``'s cut points."""

    def __init__(self, seq: _Sequence, spec: ChunkSpec) -> None:
        self.n = len(seq.offsets)
        self.size, self.overlap = spec.size, spec.overlap
        self.spaced, self.words, self.clean, self.sentences = seq.spaced, seq.words, seq.clean, seq.sentences
        self.walls = seq.walls

    def next_wall(self, first: int) -> int:
        """The first wall after token ``first`` (n: none): a chunk from ``first`` ends there at the latest."""
        k = bisect_right(self.walls, first)
        return self.walls[k] if k < len(self.walls) else self.n

    def end(self, first: int, floor: int) -> int:
        """The end of the window that starts at token ``first`` and holds at most ``size`` tokens, past
        ``floor`` (the previous chunk's end), and no wall inside: its last sentence end, else its last word
        start after whitespace, if either keeps the chunk half full; else its last word start or wall; else
        (a character of more than ``size`` tokens) the next point it can be cut at."""
        limit = min(first + self.size, self.next_wall(first))
        half = (self.size + 1) // 2
        for candidates, least in ((self.sentences, half), (self.spaced, half), (self.words, 1), (self.clean, 1)):
            at = _last_in(candidates, max(first + least - 1, floor), limit)
            if at is not None:
                return at
        k = bisect_right(self.clean, first)
        return self.clean[k] if k < len(self.clean) else self.n

    def next_start(self, first: int, last: int) -> int:
        """Where the window after the chunk [first, last) starts: ``overlap`` tokens back at most, at a
        word start, after ``first`` and after any wall before ``last`` (a window holds none inside);
        later, where that lets the window reach the end of the word at ``last`` (a shorter overlap rather
        than a cut inside a word that fits a window)."""
        low = max(last - self.overlap, first + 1)
        k = bisect_right(self.walls, last)
        if k:
            low = max(low, self.walls[k - 1])
        k = bisect_left(self.words, last)
        if k < len(self.words) and self.words[k] == last:  # the chunk ends at a word: reach that word's end
            reach = (self.words[k + 1] if k + 1 < len(self.words) else self.n) - self.size
            low = reach if low < reach <= last else low
        for candidates in (self.spaced, self.words, self.clean):
            at = _first_in(candidates, low, last)
            if at is not None:
                return at
        return last


def _last_in(points: list[int], after: int, upto: int) -> int | None:
    """The largest point p with after < p <= upto, or None."""
    k = bisect_right(points, upto) - 1
    return points[k] if k >= 0 and points[k] > after else None


def _first_in(points: list[int], low: int, upto: int) -> int | None:
    """The smallest point p with low <= p <= upto, or None."""
    k = bisect_left(points, low)
    return points[k] if k < len(points) and points[k] <= upto else None


def _blank(text: str, token: tuple[int, int]) -> bool:
    """Whether ``token`` is all whitespace (a byte-level "\\n\\n" or "Ġ"; BERT has none)."""
    start, stop = token
    return start < stop and text[start:stop].isspace()


def _after_space(text: str, token: tuple[int, int]) -> bool:
    """Whether whitespace comes just before ``token``, or begins it (a byte-level token carries its space;
    BERT's offsets leave it out)."""
    start, stop = token
    return (start < stop and text[start].isspace()) or (start > 0 and text[start - 1].isspace())


def _sentence_starts(text: str) -> set[int]:
    """The characters that begin a sentence after another: each the first one, not whitespace, after a
    stop and whitespace, a full-width stop, or a line break."""
    return {m.end() for m in _SENTENCE_END.finditer(text)}


def _text_start(text: str, start: int) -> int:
    """The first character at or after ``start`` that is not whitespace (a byte-level token may begin
    with its space, or be all whitespace), or ``start`` past a long run."""
    at = start
    while at < len(text) and text[at].isspace():
        at += 1
        if at - start > _LOOK_AHEAD:
            return start
    return at
