"""services/tokenizer/layout.py: a ChunkRequest's layout is chunking.cut's, within the room the model
and the prompt leave a chunk, and within the service's limit on chunks (no NATS here; the service over
NATS: tests/integration/test_chunk_layout.py)."""

from __future__ import annotations

import pytest

from embedfleet.services.tokenizer.chunking import cut, whole_text_tokenizer
from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.services.tokenizer.layout import Layouts
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.protocol import ChunkRequest, EmbedOptions
from embedfleet.shared.text_chunks import ChunkSpec
from tests.support.corpus import mixed_texts

PROMPTS = {"query": "query: ", "long": "Represent this sentence for searching relevant passages: "}


@pytest.fixture(scope="module")
def encoder(model_info) -> TextEncoder:
    return TextEncoder(model_info, PROMPTS)


def _request(texts: list[str], spec: ChunkSpec, **prompt) -> ChunkRequest:
    return ChunkRequest("r", "all-MiniLM-L6-v2", texts, spec, **prompt)


def test_the_layout_is_cuts_of_each_whole_text(encoder):
    texts = [*mixed_texts(40)[:24], "", "   ", "one short line"]
    spec = ChunkSpec(64, 8, "sentence")
    layout = Layouts(encoder, 4096).layout(_request(texts, spec))
    reference = whole_text_tokenizer(encoder._by_mode["right"])  # as tests/tokenizer/test_chunking.py cuts
    encodings = [reference.encode(t, add_special_tokens=False) for t in texts]
    assert layout.chunks() == [cut(t, e, spec) for t, e in zip(texts, encodings)]
    assert layout.tokens.tolist() == [len(e.ids) for e in encodings]
    assert max(layout.counts) > 3 and layout.counts[-3:].tolist() == [1, 1, 1]  # long texts are cut, short ones not


def test_room_is_the_limit_less_special_tokens_and_the_prompt(encoder):
    assert encoder.room(EmbedOptions()) == 256 - 2  # [CLS], [SEP]
    assert encoder.room(EmbedOptions(input_type="query")) == 256 - 2 - 2  # "query", ":"
    long_prompt = len(encoder._by_mode["none"].encode(PROMPTS["long"], add_special_tokens=False).ids)
    assert encoder.room(EmbedOptions(prompt_name="long")) == 256 - 2 - long_prompt


def test_a_window_over_the_room_is_refused(encoder):
    layouts = Layouts(encoder, 1024)
    layouts.check(_request(["a"], ChunkSpec(254)))
    with pytest.raises(ServiceError) as err:
        layouts.check(_request(["a"], ChunkSpec(255)))
    assert (err.value.code, err.value.row) == (ErrorCode.INVALID_REQUEST, None)
    assert err.value.message == (
        "chunking.size is 255; this model holds at most 254 tokens of text a chunk "
        "(its limit, less its special tokens and the prompt)"
    )
    layouts.check(_request(["a"], ChunkSpec(252), input_type="query"))
    with pytest.raises(ServiceError, match=r"^chunking.size is 253; this model holds at most 252 tokens"):
        layouts.check(_request(["a"], ChunkSpec(253), input_type="query"))
    with pytest.raises(ServiceError, match=r"^the model has no prompt 'passage' \(its prompts: long, query\)$"):
        layouts.check(_request(["a"], ChunkSpec(8), prompt_name="passage"))


def test_more_chunks_than_the_limit_are_refused_at_the_input_that_passes_it(encoder):
    words = " ".join(["word"] * 40)  # 40 tokens: 5 chunks of 8
    texts = ["short", words, words, "short"]  # chunks 1, 5, 5, 1: the limit of 8 is passed by input 2
    layouts = Layouts(encoder, 8)
    with pytest.raises(ServiceError) as err:
        layouts.layout(_request(texts, ChunkSpec(8)))
    assert (err.value.code, err.value.row) == (ErrorCode.INPUT_TOO_LONG, 2)
    assert err.value.text() == (
        "input 2 takes the request past 8 chunks, the most one may be cut into: its texts up to it make "
        "11 (send fewer or shorter texts, or a larger chunking.size)"
    )
    assert Layouts(encoder, 12).layout(_request(texts, ChunkSpec(8))).counts.tolist() == [1, 5, 5, 1]
