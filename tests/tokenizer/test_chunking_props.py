"""chunking.cut's promises, fuzzed with hypothesis over texts made of what breaks naive cuts: code, URLs,
CJK, emoji, long punctuation runs, mixed whitespace, accents, long words of many pieces, any characters.

For every chunk: its text tokenized alone (as the service tokenizes an input, without special tokens and
prompt) is exactly its tokens, by ``tokenizers`` and by kitoken (the service's faster path) where it
serves that text; at most ``size`` of them; the chunks in order over the text (test_chunking._check_alone).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from embedfleet.services.tokenizer import fast_encoder
from embedfleet.services.tokenizer.chunking import ChunkSpec, cut, whole_text_tokenizer
from embedfleet.services.tokenizer.encoder import TextEncoder
from tests.tokenizer.test_chunking import _check_alone

_PIECES = [
    "def floor_divide(x1, x2, /, out=None, *, where=True):\n",
    "    return a // b  # a = a % b + b * (a // b)\n",
    "``a = a % b + b * (a // b)``",
    "https://example.com/path/to/page?query=1&b=two#frag",
    "http://a.b/c_d.",
    "x.y@z.org",
    "我爱北京天安门。天安门上太阳升\uff01",
    "你好吗\uff1f",
    "😀🎉👍🏽",
    "👨\u200d👩\u200d👧\u200d👦",
    "🇫🇷🇯🇵",
    "✨sparkles✨",
    "Crème brûlée, naïve café",
    "e\u0301le\u0300ve cafe\u0301 \u0301a",
    "ΣΊΣΥΦΟΣ ἀρχή",
    "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "0x7f3a9c2e1b4d8f6a5c3e9b1d7f2a4c6e",
    "dGhpcyBpcyBiYXNlNjQgZW5jb2RlZCB0ZXh0",
    "supercalifragilisticexpialidocious",
    "\n\n\n",
    "\r\n",
    "\t\t",
    "  \u00a0 ",
    "\u200b",
    "\x00",
    " ",
    " ",
    ". ",
    "e.g. ",
]
_RUNS = st.builds(lambda ch, k: ch * k, st.sampled_from([*"=-*#.!?/_~`|<>()[]{}", "=>", "…"]), st.integers(2, 80))
_WORDS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
_ALNUM = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=10, max_size=100)
_TEXTS = st.lists(st.one_of(st.sampled_from(_PIECES), _RUNS, _WORDS, _ALNUM), min_size=1, max_size=16).map("".join)


@st.composite
def _specs(draw) -> ChunkSpec:
    size = draw(st.one_of(st.integers(1, 8), st.integers(9, 128)))
    return ChunkSpec(size, draw(st.integers(0, size - 1)), draw(st.sampled_from(["token", "sentence"])))


@pytest.fixture(scope="module")
def tokenizer(model_info) -> Tokenizer:
    return whole_text_tokenizer(TextEncoder(model_info)._by_mode["none"])


@pytest.fixture(scope="module")
def kit(model_info) -> fast_encoder.FastEncoder | None:
    """kitoken as the service loads it where installed (None: the service has only ``tokenizers``)."""
    encoder = TextEncoder(model_info)
    try:
        return fast_encoder.load(model_info.path / "tokenizer.json", encoder._by_mode["none"], encoder.max_length)
    except ImportError:
        return None


@settings(
    # hypothesis's default count; make test-fast draws fewer, EMBEDFLEET_FUZZ_EXAMPLES=2000 digs deeper
    max_examples=int(os.environ.get("EMBEDFLEET_FUZZ_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=_TEXTS, spec=_specs())
# a control character that makes no token before a Hangul syllable that makes three (decomposed): one chunk
@example(text="\x1b\ubbb4", spec=ChunkSpec(1, 0, "token"))
def test_every_chunk_is_its_texts_tokens_within_size(tokenizer, kit, text, spec):
    chunks = cut(text, tokenizer.encode(text, add_special_tokens=False), spec, tokenizer)
    _check_alone(tokenizer, text, chunks, spec)
    # what no chunk holds (before, between, after them) has no tokens: the chunks cover the text
    bounds = [0, *(x for c in chunks for x in (c.start, c.end)), len(text)]
    gaps = [text[a:b] for a, b in zip(bounds[::2], bounds[1::2]) if b > a]
    assert not any(e.ids for e in tokenizer.encode_batch(gaps, add_special_tokens=False)), gaps
    if kit is not None:  # the service embeds a chunk's text through kitoken where it agrees with tokenizers
        pieces = [text[c.start : c.end] for c in chunks]
        served = [i for i, piece in enumerate(pieces) if kit.agrees(piece)]
        for i, ids in zip(served, kit.content([pieces[i] for i in served])):
            assert list(ids) == chunks.ids[chunks[i].first : chunks[i].last], (pieces[i], chunks[i])
