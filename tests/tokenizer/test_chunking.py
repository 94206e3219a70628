from __future__ import annotations

import itertools
import re
import time
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy
import pytest
from tokenizers import Encoding, Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

from embedfleet.services.tokenizer.bulk_chunks import BatchCutter
from embedfleet.services.tokenizer.chunking import (
    BOUNDARIES,
    Chunks,
    ChunkSpec,
    TextChunk,
    chunk_ids,
    chunked_tokens,
    cut,
    whole_text_tokenizer,
)
from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.services.tokenizer.layout import Layouts
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.protocol import ChunkRequest, EmbedOptions, JobBatch
from embedfleet.shared.text_chunks import JobChunking
from tests.support.corpus import mixed_texts

# text the Python docs corpus lacks: accents (composed and combining), CJK with full-width stops, emoji,
# URLs, a word of many pieces, one over WordPiece's 100 characters, runs of newlines, tabs, characters
# the normalizer drops, quotes after a stop
_ODD = [
    "Crème brûlée, naïve café, Zoë's résumé; e\u0301le\u0300ve cafe\u0301 \u0301a and ΣΊΣΥΦΟΣ ἀρχή.",
    "我爱北京天安门。天安门上太阳升！你好吗？今天天气很好，我们去公园散步吧。",
    "Emoji 😀🎉👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 and ✨sparkles✨ in a row.",
    "See https://example.com/path/to/page?query=1&b=two#frag or http://a.b/c_d. Mail me: x.y@z.org!",
    "Pneumonoultramicroscopicsilicovolcanoconiosis and supercalifragilisticexpialidocious are long words.",
    "x" * 150 + " " + "antidisestablishmentarianism" * 3 + " done",
    "Line one\n\n\n\nLine two\r\nLine three\n\t\tindented  \u00a0 spaced\u200bzero\x00null\u0301mark",
    'He said "Stop." Then (quietly.) she left… Why? Because! 3.14 is pi, e.g. this, i.e. that.',
    "مرحبا بالعالم. Привет, мир! שלום עולם. नमस्ते दुनिया। 안녕하세요 세계.",
    "\n\n  leading and trailing whitespace   \n\n",
]


@pytest.fixture(scope="module")
def tokenizer(model_info) -> Tokenizer:
    return whole_text_tokenizer(TextEncoder(model_info)._by_mode["right"])  # the service's, as it will use it


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    texts = mixed_texts(48)
    odd = " ".join(_ODD)
    return [*texts[:24], *_ODD, "\n\n".join(texts[24:]), "\n".join([odd] * 4)]


@pytest.fixture(scope="module")
def docs(tokenizer, corpus) -> list[_Doc]:
    return [_Doc(text, _encode(tokenizer, text)) for text in corpus]


def _encode(tokenizer: Tokenizer, text: str):
    return tokenizer.encode(text, add_special_tokens=False)


def _chunks(tokenizer: Tokenizer, text: str, spec: ChunkSpec) -> list[tuple[str, int, int]]:
    return [(text[c.start : c.end], c.first, c.last) for c in cut(text, _encode(tokenizer, text), spec, tokenizer)]


# a sentence ends before token i when the text before its first character that is not whitespace ends
# with a stop and whitespace, a full-width stop, or a line break and whitespace (read back from each
# token here; the module finds them in one pass forward)
_SENTENCE_END = re.compile(r"(?:[.!?…।؟۔][\"')\]}»”’」』]*\s+|[。！？][\"')\]}»”’」』]*\s*|[\n\r]\s*)\Z")


def _sentence_end(text: str, offsets: list, i: int) -> bool:
    at, stop = offsets[i]
    while at < stop and text[at].isspace():  # a byte-level token may begin with its space
        at += 1
    return _SENTENCE_END.search(text[max(0, at - 40) : at]) is not None


@dataclass
class _Doc:
    """A text with what the checks read of its whole tokenization."""

    text: str
    enc: Encoding
    word_start: set[int] = field(init=False)  # token indices a chunk may start or end at, 0 and n included
    ends: list[int] = field(init=False)  # word starts that end a sentence

    def __post_init__(self) -> None:
        words, offsets, n = self.enc.word_ids, self.enc.offsets, len(self.enc.ids)
        # a word of the pre-tokenizer's, not after a whitespace token (byte-level BPE splits a run of
        # whitespace by what follows it)
        self.word_start = {0, n} | {
            i
            for i in range(1, n)
            if words[i] != words[i - 1] and not self.text[offsets[i - 1][0] : offsets[i - 1][1]].isspace()
        }
        self.ends = [i for i in sorted(self.word_start - {0, n}) if _sentence_end(self.text, offsets, i)]

    def word_tokens(self, at: int) -> int:
        """Tokens of the word token ``at`` is in, between the word starts around it."""
        starts = sorted(self.word_start)
        k = bisect_right(starts, at)
        return starts[k] - starts[k - 1]


def _check(tokenizer: Tokenizer, doc: _Doc, spec: ChunkSpec) -> tuple[list[TextChunk], int, int]:
    """Asserts what every cut promises; returns the chunks, how many lie in a text that has a word longer
    than the window (cut into pieces tokenized alone), and how many end at a sentence end."""
    text, enc = doc.text, doc.enc
    chunks = cut(text, enc, spec, tokenizer)
    word_start, ends = doc.word_start, doc.ends
    _check_alone(tokenizer, text, chunks, spec)
    starts = sorted(word_start)
    if max(b - a for a, b in itertools.pairwise(starts)) > spec.size:  # a word cut into pieces: the checks
        return chunks, len(chunks), 0  # below read the whole text's tokens, which its pieces' replace
    n, offsets = len(enc.ids), enc.offsets
    for c in chunks:
        # the tokens' characters, widened only over characters no token covers, never over whitespace
        floor = offsets[c.first - 1][1] if c.first else 0
        ceiling = offsets[c.last][0] if c.last < n else len(text)
        assert min(floor, offsets[c.first][0]) <= c.start <= offsets[c.first][0]
        assert offsets[c.last - 1][1] <= c.end <= max(ceiling, offsets[c.last - 1][1])
        widened = text[c.start : offsets[c.first][0]] + text[offsets[c.last - 1][1] : c.end]
        assert not any(ch.isspace() for ch in widened), (text[c.start : c.end], c)
        assert c.first in word_start and c.last in word_start, (text[c.start : c.end], c)  # cuts between words
    if spec.boundary == "sentence":
        floor = 0
        for c in chunks[:-1]:  # the last sentence end in the window's second half (past the last chunk) is taken
            low, high = max(c.first + (spec.size + 1) // 2, floor + 1), c.first + spec.size
            taken = ends[bisect_right(ends, high) - 1] if ends and ends[0] <= high else -1
            assert c.last == taken or taken < low, (text[c.start : c.end], c, taken)
            floor = c.last
    return chunks, 0, len(set(ends) & {c.last for c in chunks})


def _check_alone(tokenizer: Tokenizer, text: str, chunks: Chunks, spec: ChunkSpec) -> None:
    """The promises docs/http-api.md makes for every chunk: its text tokenized alone (no special tokens) is exactly its
    tokens, at most ``size`` of them (more only for a single character that alone makes more: a byte-level
    tokenizer's emoji); the chunks cover the text's tokens in order, consecutive ones sharing at most
    ``overlap``; their texts run in order from the text's first token to its last."""
    alone = tokenizer.encode_batch([text[c.start : c.end] for c in chunks], add_special_tokens=False)
    for c, ids, e in zip(chunks, chunk_ids(chunks.ids, chunks), alone):
        assert e.ids == ids, (text[c.start : c.end], c)
        # one character makes every token (its text may hold characters that make none: '\x1b뮴', size 1)
        one_char = c.end - c.start == 1 or len(set(e.offsets)) == 1
        assert 1 <= c.tokens <= spec.size or (c.tokens > spec.size and one_char) or not chunks.ids, (
            text[c.start : c.end],
            c,
        )
    assert chunks[0].first == 0 and chunks[-1].last == len(chunks.ids)
    for a, b in itertools.pairwise(chunks):
        assert a.first < b.first <= a.last < b.last  # in order, every token covered
        assert a.last - b.first <= spec.overlap
        assert a.start < b.start <= a.end < b.end or (a.start <= b.start and a.end <= b.end), (a, b)


_SPECS = [
    (size, overlap)
    for size in (1, 2, 3, 5, 8, 16, 64, 254)
    for overlap in sorted({0, 1, size // 2, size - 1})
    if overlap < size
]


@pytest.mark.parametrize("size,overlap", _SPECS)
def test_chunks_cover_the_text_within_size_and_retokenize_to_their_ids(tokenizer, docs, size, overlap):
    # each token is tokenized again in size / (size - overlap) chunks: long texts only where that is few
    if size < 8 or size > 4 * (size - overlap):
        docs = [d for d in docs if len(d.text) < 4000]
    inside = 0
    for boundary in BOUNDARIES:
        for doc in docs:
            inside += _check(tokenizer, doc, ChunkSpec(size, overlap, boundary))[1]
    if size >= 64:  # only the word of 84 characters (21 pieces) runs past a window this large
        assert inside == 0


def test_sentence_mode_cuts_at_sentence_ends(tokenizer, docs):
    for size in (16, 64, 128):
        token = sum(_check(tokenizer, d, ChunkSpec(size, 0, "token"))[2] for d in docs)
        cuts = [_check(tokenizer, d, ChunkSpec(size, 0, "sentence")) for d in docs]
        sentence, chunks = sum(c[2] for c in cuts), sum(len(c[0]) for c in cuts)
        assert sentence > 2 * token, (size, token, sentence)
        if size >= 64:  # sentences of the docs run some 20-40 tokens: most windows this large hold an end
            assert sentence > 0.5 * (chunks - len(docs)), (size, sentence, chunks)


def test_windows_are_filled(tokenizer, docs):
    for size, overlap in ((16, 0), (64, 8), (128, 32)):
        for boundary, fill in (("token", 0.9), ("sentence", 0.8)):  # measured 0.94-0.97 and 0.86-0.89
            spec = ChunkSpec(size, overlap, boundary)
            inner = [c for d in docs for c in cut(d.text, d.enc, spec, tokenizer)[:-1]]
            assert len(inner) > 100 and sum(c.tokens for c in inner) >= fill * size * len(inner)
            if size >= 64:  # no word this long in the corpus: every chunk at least half full
                assert min(c.tokens for c in inner) >= (size + 1) // 2


def test_text_that_fits_is_one_chunk_of_its_tokens(tokenizer, corpus):
    assert _chunks(tokenizer, " Hello world \n", ChunkSpec(2)) == [("Hello world", 0, 2)]
    # the token of "cafe\u0301" (a decomposed é) is "cafe": the chunk keeps the accent
    assert _chunks(tokenizer, "\u0301cafe\u0301 au \u0301noir\x00", ChunkSpec(1)) == [
        ("\u0301cafe\u0301", 0, 1),
        ("au", 1, 2),
        ("\u0301noir\x00", 2, 3),
    ]
    text = corpus[1]
    n = len(_encode(tokenizer, text).ids)
    assert 10 < n <= 254
    for boundary in BOUNDARIES:
        assert cut(text, _encode(tokenizer, text), ChunkSpec(n, n - 1, boundary), tokenizer) == [
            TextChunk(0, len(text), 0, n)
        ]


@pytest.mark.parametrize("text", ["", "   \n\t ", "\u0301", "\x00\x01", "\u200b\ufeff"])
def test_text_without_tokens_is_one_empty_chunk(tokenizer, text):
    enc = _encode(tokenizer, text)
    assert cut(text, enc, ChunkSpec(4, 1, "sentence"), tokenizer) == [TextChunk(0, 0, 0, 0)]
    assert chunk_ids(enc.ids, [TextChunk(0, 0, 0, 0)]) == [[]]


def test_windows_and_overlap_fall_at_words(tokenizer):
    text = "alpha beta gamma delta epsilon"
    assert _chunks(tokenizer, text, ChunkSpec(2)) == [("alpha beta", 0, 2), ("gamma delta", 2, 4), ("epsilon", 4, 5)]
    assert _chunks(tokenizer, text, ChunkSpec(2, 1)) == [
        ("alpha beta", 0, 2),
        ("beta gamma", 1, 3),
        ("gamma delta", 2, 4),
        ("delta epsilon", 3, 5),
    ]
    assert _chunks(tokenizer, text, ChunkSpec(4, 3)) == [
        ("alpha beta gamma delta", 0, 4),
        ("beta gamma delta epsilon", 1, 5),
    ]
    # a word keeps its punctuation where a cut after whitespace keeps the chunk half full
    assert _chunks(tokenizer, "e.g. this one and that one here", ChunkSpec(6, 1)) == [
        ("e.g. this one", 0, 6),
        ("one and that one here", 5, 10),
    ]
    # ... else the cut falls at punctuation: the URL's words are "https", ":", "/", "/", "example", ...
    assert _chunks(tokenizer, "see https://example.com/a_b?c=1 now", ChunkSpec(8, 2)) == [
        ("see https://example.com", 0, 8),
        (".com/a_b?c", 6, 14),
        ("?c=1 now", 12, 17),
    ]


def test_a_word_longer_than_the_window_is_cut_into_pieces_tokenized_alone(tokenizer):
    text = "a supercalifragilisticexpialidocious word"
    enc = _encode(tokenizer, text)
    chunks = cut(text, enc, ChunkSpec(4, 1), tokenizer)
    # pieces of at most 4 tokens alone, the longest from each piece's start; no overlap across a piece's edge
    assert [(text[c.start : c.end], c.first, c.last) for c in chunks] == [
        ("a", 0, 1),
        ("supercalifrag", 1, 5),
        ("ilisticexpia", 5, 9),
        ("lidocious word", 9, 13),
    ]
    ids = chunk_ids(chunks.ids, chunks)
    assert ids[1] == enc.ids[1:5]  # a piece at the word's start: the whole text's tokens
    assert tokenizer.id_to_token(enc.ids[5]) == "##ilis" and tokenizer.id_to_token(ids[2][0]) != "##ilis"
    assert ids == [e.ids for e in tokenizer.encode_batch([text[c.start : c.end] for c in chunks], False)]
    with pytest.raises(ValueError, match="pass the tokenizer"):
        cut(text, enc, ChunkSpec(4, 1))


def test_numpy_docstring_chunks_hold_their_tokens(tokenizer):
    """Code text (numpy's floor_divide docstring), as reported: every chunk's text alone is its tokens, at
    most ``size``, at the reported size and at sizes its longest words pass."""
    text = numpy.floor_divide.__doc__
    for size, overlap in ((100, 20), (3, 1), (1, 0)):
        spec = ChunkSpec(size, overlap)
        chunks = cut(text, _encode(tokenizer, text), spec, tokenizer)
        _check_alone(tokenizer, text, chunks, spec)
        assert chunks[-1].end == len(text.rstrip())


def test_sentence_mode_cuts_after_the_last_sentence_end(tokenizer):
    spec = ChunkSpec(6, 0, "sentence")
    assert _chunks(tokenizer, "One two. Three four five six seven eight.", spec) == [
        ("One two.", 0, 3),
        ("Three four five six seven", 3, 8),
        ("eight.", 8, 10),
    ]
    assert _chunks(tokenizer, "One two. Three four five six seven eight.", ChunkSpec(6)) == [
        ("One two. Three four five", 0, 6),
        ("six seven eight.", 6, 10),
    ]
    assert _chunks(tokenizer, 'He said "Stop." Then we left the old place at last.', ChunkSpec(10, 0, "sentence")) == [
        ('He said "Stop."', 0, 6),
        ("Then we left the old place at last.", 6, 15),
    ]
    assert _chunks(tokenizer, "我爱北京。天安门很大。", ChunkSpec(7, 0, "sentence")) == [
        ("我爱北京。", 0, 5),
        ("天安门很大。", 5, 11),
    ]
    assert _chunks(tokenizer, "Title\nbody words here", ChunkSpec(2, 0, "sentence")) == [
        ("Title", 0, 1),
        ("body words", 1, 3),
        ("here", 3, 4),
    ]
    assert _chunks(tokenizer, "Title\nbody words here", ChunkSpec(2)) == [("Title\nbody", 0, 2), ("words here", 2, 4)]
    # no sentence end in the window's second half: cut as "token" does
    assert _chunks(tokenizer, "Hi. one two three four five six seven", ChunkSpec(8, 0, "sentence")) == [
        ("Hi. one two three four five six", 0, 8),
        ("seven", 8, 9),
    ]
    assert _chunks(tokenizer, "नमस्ते दुनिया। फिर मिलेंगे", ChunkSpec(12, 0, "sentence"))[0][0] == "नमस्ते दुनिया।"
    # not sentence ends: a stop with no whitespace after it
    assert _chunks(tokenizer, "pi is 3.14 and x.y is z here", ChunkSpec(6, 0, "sentence")) == [
        ("pi is 3.14 and", 0, 6),
        ("x.y is z here", 6, 12),
    ]


def test_chunk_ids_are_the_encodings_slices(tokenizer, corpus):
    text = corpus[-1]
    enc = _encode(tokenizer, text)
    chunks = cut(text, enc, ChunkSpec(50, 10, "sentence"), tokenizer)
    ids = chunk_ids(enc.ids, chunks)
    assert [len(i) for i in ids] == [c.tokens for c in chunks]
    assert all(i == enc.ids[c.first : c.last] for i, c in zip(ids, chunks))
    assert chunked_tokens(chunks) == sum(map(len, ids)) > len(enc.ids)  # overlaps count in both chunks
    assert chunked_tokens(cut(text, enc, ChunkSpec(50), tokenizer)) == len(enc.ids)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"size": 0}, "chunking.size must be an integer of at least 1, got 0"),
        ({"size": -3}, "chunking.size must be an integer of at least 1, got -3"),
        ({"size": 2.5}, "chunking.size must be an integer of at least 1, got 2.5"),
        ({"size": True}, "chunking.size must be an integer of at least 1, got True"),
        ({"size": 8, "overlap": -1}, "chunking.overlap must be an integer of at least 0, got -1"),
        ({"size": 8, "overlap": "2"}, "chunking.overlap must be an integer of at least 0, got '2'"),
        ({"size": 8, "overlap": 8}, "chunking.overlap (8) must be less than chunking.size (8)"),
        ({"size": 8, "overlap": 9}, "chunking.overlap (9) must be less than chunking.size (8)"),
        ({"size": 8, "boundary": "word"}, "chunking.boundary must be 'token' or 'sentence', got 'word'"),
        ({"size": 8, "boundary": None}, "chunking.boundary must be 'token' or 'sentence', got None"),
    ],
)
def test_invalid_specs_are_refused_with_clear_messages(kwargs, message):
    with pytest.raises(ServiceError) as err:
        ChunkSpec(**kwargs)
    assert err.value.code is ErrorCode.INVALID_REQUEST and err.value.row is None
    assert err.value.text() == message


def test_size_over_the_models_room_is_refused():
    ChunkSpec(254, 10).check_room(254)
    with pytest.raises(ServiceError) as err:
        ChunkSpec(255, 10).check_room(254)
    assert err.value.code is ErrorCode.INVALID_REQUEST
    assert err.value.text() == (
        "chunking.size is 255; this model holds at most 254 tokens of text a chunk "
        "(its limit, less its special tokens and the prompt)"
    )


def _trained(kind: str, texts: list[str]) -> Tokenizer:
    """A small tokenizer of another family, trained here on the corpus: byte-level BPE (GPT-2, Qwen),
    whose tokens carry their leading space and split characters into bytes, or SentencePiece-style
    Unigram over Metaspace (XLM-R, T5), whose words are whole runs between spaces, CJK text included."""
    if kind == "byte-level":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(
            vocab_size=1500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        )
    else:
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=1500, unk_token="<unk>", special_tokens=["<unk>"], show_progress=False
        )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


@pytest.mark.parametrize("kind", ["byte-level", "metaspace"])
def test_other_tokenizer_families_keep_the_promises(corpus, kind):
    tokenizer = _trained(kind, [*mixed_texts(60), *_ODD])
    docs = [_Doc(text, _encode(tokenizer, text)) for text in corpus if len(text) < 4000]
    inside = whole = 0
    for size, overlap in ((1, 0), (3, 1), (8, 4), (32, 8), (64, 63)):
        for boundary in BOUNDARIES:
            for doc in docs:
                chunks, cut_inside, _ = _check(tokenizer, doc, ChunkSpec(size, overlap, boundary))
                inside, whole = inside + cut_inside, whole + len(chunks) - cut_inside
    assert whole > 1000 and inside > 0  # both kinds met: most chunks whole, a few in over-long words
    text = "Hello world, café 我爱北京。 😀🎉 done."
    enc = _encode(tokenizer, text)
    chunks = cut(text, enc, ChunkSpec(4, 1), tokenizer)
    if kind == "byte-level":  # a chunk keeps the space its first token carries; never a cut inside a character
        assert [text[c.start : c.end] for c in chunks] == [
            "Hello",
            " world,",
            " café",
            " 我",
            "爱",
            "北",
            "京",
            "。",
            " 😀",
            "🎉",
            " done.",
        ]
    else:  # the CJK run is one word of more tokens than the window: cut inside it
        assert any(text.index("我") < c.start < text.index(" 😀") for c in chunks)
        assert [text[c.start : c.end] for c in chunks][-2:] == [" 😀🎉", " done."]


def test_the_whole_text_tokenizer_keeps_a_byte_level_tokens_space(corpus, tokenizer, model_info):
    roberta = _trained("byte-level", [*mixed_texts(60), *_ODD])  # as roberta-base: trim_offsets=True
    roberta.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True)
    roberta.enable_truncation(16)
    text = "Hello world, this is a test of trimmed offsets here."
    spec = ChunkSpec(4)
    trimmed = cut(text, roberta.encode(text, add_special_tokens=False), spec, roberta)
    assert [text[c.start : c.end] for c in trimmed][1:3] == ["world,", "this is a"]  # the spaces lost
    whole = whole_text_tokenizer(roberta)
    assert roberta.truncation is not None and whole.truncation is None and whole.post_processor is None
    doc = _Doc(text, _encode(whole, text))
    assert len(doc.enc.ids) > 16
    roberta.no_truncation()
    chunks, inside, _ = _check(roberta, doc, spec)  # re-tokenized by the model's own tokenizer
    assert [text[c.start : c.end] for c in chunks][1:3] == [" world,", " this is a"] and inside == 0
    # BERT's offsets leave out the space: the copy changes nothing there
    text = corpus[3]
    bert = TextEncoder(model_info)._by_mode["right"]
    assert _encode(tokenizer, text).offsets == bert.encode(text, add_special_tokens=False).offsets
    assert bert.encode(text).ids[0] == 101 and bert.truncation is not None  # the model's tokenizer untouched


def test_a_long_document_is_cut_quickly(tokenizer, corpus):
    text = "\n\n".join(corpus) * 4
    enc = _encode(tokenizer, text)
    assert len(enc.ids) > 50_000
    began = time.perf_counter()
    chunks = cut(text, enc, ChunkSpec(254, 32, "sentence"), tokenizer)
    took = time.perf_counter() - began
    assert len(chunks) > 200 and took < 1.0, took  # ~0.1 s unloaded: one pass over the tokens


def test_job_rows_and_layouts_are_the_tokens_of_their_chunks_texts(model_info):
    """A job's plain rows and a request's layout, of texts with words longer than the chunk: each row is
    the model's sequence for its chunk's text, and the layout counts each chunk's text's tokens."""
    encoder = TextEncoder(model_info)
    texts = [
        "a supercalifragilisticexpialidocious word, 0x7f3a9c2e1b4d8f6a5c3e9b1d7f2a4c6e",
        numpy.floor_divide.__doc__,
    ]
    spec = ChunkSpec(3, 1)
    job = JobBatch("j", 0, "m", ["a", "b"], texts, EmbedOptions(), JobChunking(spec, with_text=True))
    rows = BatchCutter(encoder, 4096).cut(job)
    assert rows.chunks.texts and rows.sequences == encoder.encode(rows.chunks.texts, truncate=False)
    layout = Layouts(encoder, 4096).layout(ChunkRequest("r", "m", texts, spec))
    pieces = [t[c.start : c.end] for t, cs in zip(texts, layout.chunks()) for c in cs]
    assert pieces == rows.chunks.texts
    assert (layout.lasts - layout.firsts).tolist() == [len(s) - 2 for s in rows.sequences]  # [CLS] and [SEP]
    assert max(len(s) for s in rows.sequences) <= spec.size + 2
