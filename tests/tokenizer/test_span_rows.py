"""Late chunking's spans placed in the token sequences their texts make (all-MiniLM-L6-v2's tokenizer):
past [CLS] and the prompt, an empty text's span over its whole sequence, and a text that tokenizes to
other than its spans' content tokens refused, naming its row."""

from __future__ import annotations

import numpy as np
import pytest

from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.services.tokenizer.span_rows import place_spans
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.protocol import EmbedOptions, Spans

QUERY = EmbedOptions(input_type="query", output="spans", truncate=False)


@pytest.fixture(scope="module")
def encoder(model_info) -> TextEncoder:
    return TextEncoder(model_info, {"query": "query: "})


def test_the_frame_is_the_special_tokens_and_the_prompt(encoder):
    assert encoder.frame_sizes(EmbedOptions()) == (1, 1)  # [CLS] ... [SEP]
    assert encoder.frame_sizes(QUERY) == (3, 1)  # [CLS] query : ... [SEP]
    assert sum(encoder.frame_sizes(QUERY)) == encoder.max_length - encoder.room(QUERY)


def test_spans_move_past_the_tokens_before_the_text(encoder):
    texts = ["late chunking pools chunks", ""]
    ids = encoder.encode(encoder.with_prompt(texts, QUERY), truncate=False)
    content = len(ids[0]) - 4
    placed = place_spans(Spans.of([[(0, 2), (1, content)], [(0, 0)]], [content, 0]), ids, *encoder.frame_sizes(QUERY))
    assert placed.counts.tolist() == [2, 1]
    assert list(zip(placed.firsts.tolist(), placed.lasts.tolist())) == [(3, 5), (4, 3 + content), (0, len(ids[1]))]
    assert placed.tokens is None
    window = ids[0][3 : 3 + content]  # the content tokens are the text's own
    assert window == encoder.encode(texts[:1], truncate=False)[0][1:-1]


def test_a_text_that_tokenizes_otherwise_is_refused_with_its_row(encoder):
    texts = ["one two", "three four five"]
    ids = encoder.encode(texts, truncate=False)
    with pytest.raises(ServiceError) as err:
        place_spans(Spans.of([[(0, 2)], [(0, 2)]], [2, 2]), ids, *encoder.frame_sizes(EmbedOptions()))
    assert err.value.code is ErrorCode.INVALID_REQUEST and err.value.row == 1
    assert err.value.message.startswith("makes 3 content tokens, where its spans count 2"), err.value.message
    assert np.array_equal(place_spans(Spans.of([[(0, 2)], [(0, 3)]], [2, 3]), ids, 1, 1).lasts, [3, 4])
