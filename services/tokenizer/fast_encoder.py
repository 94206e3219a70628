"""An optional faster text -> token IDs for BERT WordPiece models: kitoken, with HF tokenizers' exact IDs.

kitoken (Rust, optional dependency) tokenizes all-MiniLM-L6-v2's WordPiece with about a quarter of the
CPU of ``tokenizers``. It reads the same tokenizer.json but adds no special tokens and truncates on its
own terms, and its Unicode tables are newer than those of ``tokenizers``: the code points listed in
``fast_charset`` (unassigned or recently assigned ones, and the capital sigma, which it lowercases to a
final sigma at a word's end) come out differently. So here kitoken gives only the content tokens of texts
free of those code points; the special tokens and the truncation are added as ``TextEncoder._encode``
adds them, and every other text goes to ``tokenizers``. Before it serves, ``check`` compares both on a
built-in corpus; the service keeps ``tokenizers`` when kitoken is missing, the folder is no plain BERT
WordPiece, or the check finds one differing token.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from embedfleet.services.tokenizer.cuts import CHARS_PER_TOKEN, SERIAL_CHARS, cut_chars
from embedfleet.services.tokenizer.fast_charset import DIVERGENT

# the tokenizer.json parts kitoken was shown to reproduce token for token (with the charset left out)
_NORMALIZER = {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "lowercase": True}
_STRIP_ACCENTS = (None, True)  # None: as lowercase, i.e. stripped


class Charset:
    """Whether a text holds a code point of ``DIVERGENT``, at the speed of one regular-expression search.

    ``re`` tests a character class of code points below 0x10000 by a table lookup, but one of astral
    ranges range by range (hundreds of them: a hundred times slower); so the search looks for the
    divergent code points below 0x10000 and for any astral one, and only a text holding an astral code
    point (an emoji) has its distinct characters from there on looked up one by one.
    """

    def __init__(self, ranges: tuple[tuple[int, int], ...] = DIVERGENT) -> None:
        self._starts = [a for a, _ in ranges]
        self._ends = [b for _, b in ranges]
        low = "".join(_span(a, min(b, 0xFFFF)) for a, b in ranges if a <= 0xFFFF)
        self._suspect = re.compile(f"[{low}{_span(0x10000, 0x10FFFF)}]")

    def holds(self, text: str) -> bool:
        if text.isascii():
            return False
        hit = self._suspect.search(text)
        if hit is None:
            return False
        return ord(hit.group()) <= 0xFFFF or any(map(self._divergent, set(text[hit.start() :])))

    def _divergent(self, char: str) -> bool:
        at = bisect_right(self._starts, ord(char)) - 1
        return at >= 0 and ord(char) <= self._ends[at]


def _span(a: int, b: int) -> str:
    return re.escape(chr(a)) + (f"-{re.escape(chr(b))}" if b > a else "")


class FastEncoder:
    """kitoken's content tokens between the reference tokenizer's special tokens, truncated as it truncates.

    ``head``/``tail``: the special tokens the reference adds before and after a text ([CLS], [SEP]).
    """

    def __init__(self, kit: Any, head: list[int], tail: list[int], max_length: int) -> None:
        self._kit = kit
        self._head = head
        self._tail = tail
        self._max_length = max_length
        self._keep = max_length - len(head) - len(tail)  # content tokens a truncated row keeps
        self._charset = Charset()

    def content(self, texts: list[str]) -> list[list[int]]:
        """Content token IDs of each text (no special tokens), as kitoken gives them."""
        if sum(map(len, texts)) > SERIAL_CHARS:  # as encode_all: few short texts on this thread
            return self._kit.encode_all(texts, True)
        return [self._kit.encode(t, True) for t in texts]

    def agrees(self, text: str) -> bool:
        """Whether kitoken is known to tokenize ``text`` as the reference does."""
        return not self._charset.holds(text)

    def encode(
        self, texts: list[str], direction: str | None, reference: Callable[[list[str]], list[list[int]]]
    ) -> list[list[int]]:
        """``TextEncoder._encode`` of ``texts`` (``direction`` None: no truncation): kitoken's IDs for
        the texts it agrees on, ``reference(rest)`` for the others."""
        window = self._max_length * CHARS_PER_TOKEN
        cut = texts if direction is None else [cut_chars(t, window, direction) for t in texts]
        mine = [i for i, t in enumerate(cut) if self.agrees(t)]
        ids: list[Any] = [None] * len(texts)
        row: list[int] | None  # kitoken's IDs, None where it disagrees with the whole text
        for i, row in zip(mine, self.content([cut[i] for i in mine])):
            if cut[i] is not texts[i] and len(row) <= self._keep:  # the cut text fit whole: the cut may matter
                row = self._kit.encode(texts[i], True) if self.agrees(texts[i]) else None
            ids[i] = None if row is None else self._finish(row, direction)
        rest = [i for i, row in enumerate(ids) if row is None]
        if rest:
            for i, row in zip(rest, reference([texts[i] for i in rest])):
                ids[i] = row
        return ids

    def _finish(self, row: list[int], direction: str | None) -> list[int]:
        if direction is not None and len(row) > self._keep:
            row = row[: self._keep] if direction == "right" else row[len(row) - self._keep :]
        return [*self._head, *row, *self._tail]


def unsupported(path: Path) -> str | None:
    """Why kitoken cannot stand in for the folder's tokenizer.json, or None when it may (``check`` decides)."""
    try:
        spec = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return f"cannot read {path}: {exc}"
    model, norm, pre = spec.get("model") or {}, spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}
    if model.get("type") != "WordPiece":
        return f"the model is {model.get('type')!r}, not WordPiece"
    if any(norm.get(k) != v for k, v in _NORMALIZER.items()) or norm.get("strip_accents") not in _STRIP_ACCENTS:
        return f"the normalizer is not an uncased BertNormalizer: {norm}"
    if pre.get("type") != "BertPreTokenizer":
        return f"the pre-tokenizer is {pre.get('type')!r}, not BertPreTokenizer"
    for token in spec.get("added_tokens") or []:
        if not token.get("special") or any(token.get(k) for k in ("normalized", "lstrip", "rstrip", "single_word")):
            return f"the added token {token.get('content')!r} is matched in a way not reproduced"
    return None


def load(path: Path, reference: Tokenizer, max_length: int) -> FastEncoder:
    """kitoken on ``path`` (a tokenizer.json), with the special tokens ``reference`` adds around a text.

    Raises ImportError without kitoken, ValueError where it cannot stand in for ``reference``.
    """
    import kitoken  # optional: the extra 'fast-tokenizer'

    reason = unsupported(path)
    if reason is not None:
        raise ValueError(reason)
    try:
        kit = kitoken.Kitoken.from_tokenizers_file(str(path))
        config = kit.config()
        config["processing"] = []  # its padding and truncation to tokenizer.json's 128: ours are applied here
        kit.set_config(config)
    except Exception as exc:  # kitoken raises its own errors for what it cannot read
        raise ValueError(f"kitoken cannot load {path}: {exc}") from None
    plain = reference.encode("a", add_special_tokens=False).ids
    full = reference.encode("a", add_special_tokens=True).ids
    at = next((i for i in range(len(full)) if full[i : i + len(plain)] == plain), None)
    if at is None:
        raise ValueError("the special tokens wrap no text")
    return FastEncoder(kit, full[:at], full[at + len(plain) :], max_length)
