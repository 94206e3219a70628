"""A long text cut into windows of at most ``size`` content tokens (chunking, late chunking). No NATS here.

The input is one ``tokenizers.Encoding`` of the whole text, made without special tokens and without
truncation by ``whole_text_tokenizer``'s copy of the model's tokenizer; every chunk is a slice of its
tokens, with the characters it spans.

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
  start (a punctuation mark, a CJK character). A word of more than ``size`` tokens (WordPiece: a run
  of letters and digits, at most 100 characters, a longer one being one [UNK]; SentencePiece: also
  CJK text, which has no spaces) is cut inside, at the last token boundary between two characters:
  those chunks' ids are still slices of the whole text's, but their text tokenized alone differs (a
  WordPiece piece "##x" reads "x" at a text's start). No token is dropped; no chunk holds more than
  ``size``.
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

from tokenizers import Encoding, Tokenizer

from embedfleet.shared.text_chunks import BOUNDARIES, ChunkSpec, TextChunk

# the request's parameters and a chunk's place live in shared/ (the gateway and the protocol read them too)
__all__ = [
    "BOUNDARIES",
    "ChunkSpec",
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


def cut(text: str, encoding: Encoding, spec: ChunkSpec) -> list[TextChunk]:
    """``text`` cut into chunks, in order, covering every token of ``encoding``: the whole text's,
    ``whole_text_tokenizer(tokenizer).encode(text, add_special_tokens=False)``."""
    offsets = encoding.offsets
    n = len(offsets)
    if n == 0:
        return [TextChunk(0, 0, 0, 0)]
    cuts = _Cuts(text, offsets, encoding.word_ids, spec)
    chunks: list[TextChunk] = []
    first = last = 0
    while True:
        last = n if n - first <= spec.size else cuts.end(first, last)
        chunks.append(TextChunk(*_span(text, offsets, first, last), first, last))
        if last == n:
            return chunks
        first = cuts.next_start(first, last)


def _span(text: str, offsets: list[tuple[int, int]], first: int, last: int) -> tuple[int, int]:
    """The characters of tokens [first, last), widened over the characters next to them that no token
    covers and are not whitespace (an accent or a vowel sign the normalizer dropped: "cafe\\u0301"'s
    token is "cafe"), so that a chunk's text holds its words whole. Such characters before the first
    token are its own only after whitespace: touching the previous token, they are that token's (NFKC
    composes "e\\u0301" into one character, whose offsets may leave out the accent)."""
    start, end = offsets[first][0], offsets[last - 1][1]
    ceiling = offsets[last][0] if last < len(offsets) else len(text)
    while end < ceiling and not text[end].isspace():
        end += 1
    floor, at = (offsets[first - 1][1] if first > 0 else 0), start
    while at > floor and not text[at - 1].isspace():
        at -= 1
    return (at if at == 0 or text[at - 1].isspace() else start), end


def chunk_ids(ids: list[int], chunks: list[TextChunk]) -> list[list[int]]:
    """Each chunk's token ids: slices of the whole text's ``ids`` (``Encoding.ids``), no tokenizing again."""
    return [ids[c.first : c.last] for c in chunks]


def chunked_tokens(chunks: list[TextChunk]) -> int:
    """Content tokens the chunks hold in all: a token shared by an overlap counts in each chunk."""
    return sum(c.tokens for c in chunks)


class _Cuts:
    """Where a text's tokens may be cut, as sorted token indices i (a cut before token i)."""

    def __init__(self, text: str, offsets: list[tuple[int, int]], word_ids: list[int | None], spec: ChunkSpec) -> None:
        self.n = len(offsets)
        self.size, self.overlap = spec.size, spec.overlap
        starts = _sentence_starts(text) if spec.boundary == "sentence" else set()
        self.spaced: list[int] = []  # word starts after whitespace: preferred, a word keeps its punctuation
        self.words: list[int] = []  # before the first token of a word
        self.clean: list[int] = []  # between two characters, in a word or not (not inside one character's bytes)
        self.sentences: list[int] = []  # word starts that end a sentence, when asked for
        for i in range(1, len(offsets)):
            if offsets[i][0] < offsets[i - 1][1]:
                continue  # one character's bytes (byte-level BPE): no character boundary to cut at
            self.clean.append(i)
            if word_ids[i] == word_ids[i - 1] or _blank(text, offsets[i - 1]):
                continue  # not after a whitespace token: byte-level BPE splits a whitespace run by what follows it
            self.words.append(i)
            if _after_space(text, offsets[i]):
                self.spaced.append(i)
            if starts and _text_start(text, offsets[i][0]) in starts:
                self.sentences.append(i)

    def end(self, first: int, floor: int) -> int:
        """The end of the window that starts at token ``first`` and holds at most ``size`` tokens, past
        ``floor`` (the previous chunk's end): its last sentence end, else its last word start after
        whitespace, if either keeps the chunk half full; else its last word start; else (one word
        longer than the window) a cut inside the word."""
        limit = first + self.size
        half = (self.size + 1) // 2
        for candidates, least in ((self.sentences, half), (self.spaced, half), (self.words, 1), (self.clean, 1)):
            at = _last_in(candidates, max(first + least - 1, floor), limit)
            if at is not None:
                return at
        return limit

    def next_start(self, first: int, last: int) -> int:
        """Where the window after the chunk [first, last) starts: ``overlap`` tokens back at most, at a
        word start, after ``first``; later, where that lets the window reach the end of the word at
        ``last`` (a shorter overlap rather than a cut inside a word that fits a window)."""
        low = max(last - self.overlap, first + 1)
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
