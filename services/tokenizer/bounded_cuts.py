"""Texts cut into chunks within limits checked before memory is spent on them. No NATS here.

Tokenizing is what costs memory: the tokenizers library's ``Encoding`` of a text and ``cut``'s lists of
its offsets take some 250 bytes a character (MiniLM's WordPiece: 1,000,000 characters of prose hold
~215 MB while encoded), whatever the chunk size. So a text of more than ``max_chars`` characters is
refused before it is read at all (``--max-document-chars``), and the others are tokenized a group at
a time, a group at most ``GROUP_CHARS`` characters (a longer text alone), each text's chunks handed
to the caller before the next group is encoded: a caller that counts chunks stops at the text that
takes it past its limit, and nothing after that text is tokenized. What one request holds at once is
then one group's encodings and the chunks counted so far, however many texts or characters it sent.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tokenizers import Tokenizer

from embedfleet.services.tokenizer.chunking import Chunks, cut
from embedfleet.services.tokenizer.encoder import encode_all
from embedfleet.shared.text_chunks import ChunkSpec

GROUP_CHARS = 1 << 16  # characters encoded at once: ~16 MB of encodings, in parallel where many texts are short


def groups(lengths: Sequence[int], budget: int = GROUP_CHARS) -> Iterator[range]:
    """Consecutive runs of texts (their indices) whose ``lengths`` sum to at most ``budget``; a longer
    text is a run alone."""
    lo, total = 0, 0
    for i, n in enumerate(lengths):
        if i > lo and total + n > budget:
            yield range(lo, i)
            lo, total = i, 0
        total += n
    if lo < len(lengths):
        yield range(lo, len(lengths))


def cuts(tokenizer: Tokenizer, texts: Sequence[str], spec: ChunkSpec) -> Iterator[Chunks]:
    """Each of ``texts`` cut (``chunking.cut``), in order, encoded a group at a time by ``tokenizer``
    (``whole_text_tokenizer``'s copy): a caller that stops reading leaves the rest untokenized. A
    ``Chunks`` holds its text's encoding until its ``ids`` are read: keep its chunks, not it."""
    for run in groups([len(t) for t in texts]):
        part = list(texts[run.start : run.stop])
        for text, encoding in zip(part, encode_all(tokenizer, part, add_special_tokens=False)):
            yield cut(text, encoding, spec, tokenizer)


def longest_over(texts: Sequence[str], max_chars: int) -> int | None:
    """The first of ``texts`` longer than ``max_chars`` characters (None: none is)."""
    return next((i for i, t in enumerate(texts) if len(t) > max_chars), None)


def chars_refusal(chars: int, max_chars: int) -> str:
    """Why a text of ``chars`` characters is not cut, the limit named (said of the text: "input 3 ...")."""
    return (
        f"has {chars} characters, over the {max_chars} a text cut into chunks may have (the tokenizer's "
        "--max-document-chars): cut it into shorter texts"
    )
