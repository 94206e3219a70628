"""Which tokenizer serves texts: kitoken where it loads and matches HF tokenizers on a built-in corpus.

The check runs once, at start-up (about half a second of CPU on all-MiniLM-L6-v2): a few hundred texts
of prose, code and whole documents past the model's limit (CPython's help topics, as tests/support/corpus.py),
edge cases (empty, blank, control characters, accents, CJK, emoji, very long words, special tokens
written out), and probes of the code points next to every range of ``fast_charset`` (where a change of
either library's Unicode tables shows first), each truncated to the right and the left and not at all.
One differing token and the service keeps HF tokenizers for everything.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from pathlib import Path
from pydoc_data.topics import topics

from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.services.tokenizer.fast_charset import DIVERGENT
from embedfleet.services.tokenizer.fast_encoder import Charset, FastEncoder, load

log = logging.getLogger("embedfleet.tokenizer")

KITOKEN = "kitoken"
TOKENIZERS = "tokenizers"

_EDGES = (
    "",
    " ",
    "   ",
    "\t\n\r ",
    "\u00a0\u2003\u3000",
    "\x00",
    "\ufffd",
    "a\x00b\tc\x07\x1b[0m",
    "\u200b\u200c\u200d\ufeff",
    "x" * 99,
    "x" * 100,
    "x" * 101,
    "é" * 101,
    "x" * 5000,
    "Hello world!",
    "Ünïcödé àccénts, çà et là; Ærøskøbing",
    "ﬁ ligature ﬀ Ａｂｃ１２３ ①②③ ½ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "İstanbul ǅ ß ẞ",
    "Ωμέγα σοφία ΟΔΥΣΣΕΥΣ",
    "Привет, мир",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "日本語のテキスト",
    "中文字符串测试，标点。",
    "한국어 텍스트",
    "😀😃👍🏽 👨\u200d👩\u200d👧\u200d👦 🇫🇷 🫠",
    "e\u0301 combining a\u0300\u0301\u0302b",
    "Z̴̡̢a̸l̵g̶o",
    "[CLS] x [SEP]",
    "a[SEP]b[MASK][MASK]",
    "[cls] [Sep] [UNK] ##s",
    "don't stop: co-op e-mail 3.14 $5,000",
    "http://example.com/a?b=c&d=e#f",
    "def f(x):\n    return x ** 2",
    "<html><body>hi</body></html>",
    "supercalifragilisticexpialidocious" * 4,
    "word " * 600,
    "ab " * 200 + "x" * 2000,
    "x" * 3000 + " tail words",
)


def corpus(paragraphs: int = 240, documents: int = 24) -> list[str]:
    """The built-in texts: paragraphs and whole help topics, the edge cases, the probes."""
    names = sorted(topics)
    docs = [" ".join(topics[n].split()) for n in names]
    paras = [" ".join(p.split()) for n in names for p in topics[n].split("\n\n") if len(p.strip()) >= 20]
    step, doc_step = max(len(paras) // paragraphs, 1), max(len(docs) // documents, 1)
    return [*paras[::step][:paragraphs], *docs[::doc_step][:documents], *_EDGES, *_probes()]


def _probes(per_text: int = 64) -> list[str]:
    """Texts of the code points just outside each divergent range, alone, inside a word and doubled."""
    charset = Charset()
    points = sorted(
        {
            c
            for a, b in DIVERGENT
            for c in (a - 1, b + 1)
            if 0 <= c <= 0x10FFFF and not 0xD800 <= c <= 0xDFFF and not charset.holds(chr(c))
        }
    )
    words = [f"{chr(c)} a{chr(c)}b {chr(c) * 2}" for c in points]
    return [" ".join(words[i : i + per_text]) for i in range(0, len(words), per_text)]


def mismatch(fast: FastEncoder, encoder: TextEncoder, texts: list[str]) -> str | None:
    """The first text ``fast`` tokenizes otherwise than ``encoder``'s tokenizers, described; None if none."""
    for truncate, direction in ((True, "right"), (True, "left"), (False, "right")):
        expected = encoder._encode_hf(texts, truncate, direction)
        got = fast.encode(
            texts, direction if truncate else None, partial(encoder._encode_hf, truncate=truncate, direction=direction)
        )
        for text, want, have in zip(texts, expected, got):
            if want != have:
                how = f"truncated {direction}" if truncate else "whole"
                return f"{text[:40]!r} ({how}): {have[:12]}... instead of {want[:12]}..."
    return None


def choose(encoder: TextEncoder, folder: Path, mode: str) -> str:
    """Sets ``encoder.fast`` when ``mode`` is auto and kitoken passes the check on the model ``folder``'s
    tokenizer.json; the path that serves."""
    encoder.fast = None
    if mode == "off":
        log.info("tokenizing with %s (--fast-tokenizer off)", TOKENIZERS)
        return TOKENIZERS
    start = time.perf_counter()
    try:
        fast = load(folder / "tokenizer.json", encoder._by_mode["none"], encoder.max_length)
        reason = mismatch(fast, encoder, corpus())
    except ImportError:
        reason = "kitoken is not installed (pip install embedfleet[fast-tokenizer])"
    except ValueError as exc:
        reason = str(exc)
    except Exception as exc:  # either library failing on the corpus: the check is failed, not the start-up
        reason = f"the check failed: {exc}"
    if reason is not None:
        log.info("tokenizing with %s: kitoken cannot stand in: %s", TOKENIZERS, reason)
        return TOKENIZERS
    encoder.fast = fast
    log.info(
        "tokenizing texts with %s (matched %s on the built-in corpus in %.2f s)",
        KITOKEN,
        TOKENIZERS,
        time.perf_counter() - start,
    )
    return KITOKEN
