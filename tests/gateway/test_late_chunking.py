"""Late chunking in the gateway: the windows a layout makes (their texts and the spans of the chunks each
owns), the vectors put back in chunk order, and the models that cannot be late-chunked refused."""

from __future__ import annotations

import numpy as np
import pytest

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.late_chunking import check_model, chunk_rows, plan
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.protocol import ChunkLayout
from embedfleet.shared.text_chunks import TextChunk

WORDS = " ".join(f"w{k}" for k in range(40))  # "w0 w1 ... w39": a word a token, 3 or 4 characters


def _layout(texts: list[str], cuts: list[list[tuple[int, int]]], room: int) -> ChunkLayout:
    """Chunks of whole words (token k is word k), as a tokenizer would cut them."""

    def chunk(text: str, first: int, last: int) -> TextChunk:
        words = text.split(" ")
        start = sum(len(w) + 1 for w in words[:first])
        return TextChunk(start, start + len(" ".join(words[first:last])), first, last)

    chunks = [[chunk(t, a, b) if b else TextChunk(0, 0, 0, 0) for a, b in cs] for t, cs in zip(texts, cuts)]
    return ChunkLayout.of("r", chunks, [len(t.split()) for t in texts], room)


def test_a_text_that_fits_is_one_window_its_whole_text():
    texts = [f"  {WORDS[:20]} \n", ""]  # whitespace around: still the whole text
    layout = _layout(texts, [[(0, 3), (2, 6)], [(0, 0)]], room=10)
    late, chunks = plan(texts, layout)
    assert late.texts == texts and late.inputs == [0, 1]
    assert late.spans.counts.tolist() == [2, 1] and late.spans.tokens.tolist() == [6, 0]
    assert list(zip(late.spans.firsts.tolist(), late.spans.lasts.tolist())) == [(0, 3), (2, 6), (0, 0)]
    assert chunks == layout.chunks()


def test_a_long_text_is_embedded_in_windows_with_spans_from_their_first_token():
    texts = [WORDS]
    cuts = [[(4 * k, 4 * k + 4) for k in range(10)]]  # 40 tokens, chunks of 4
    late, _ = plan(texts, _layout(texts, cuts, room=16))
    # the first window owns 4 chunks (16 tokens); later ones own 3 (12 = 16 - 4) and reach back 1 chunk
    assert late.texts == [" ".join(f"w{k}" for k in range(a, b)) for a, b in ((0, 16), (12, 28), (24, 40))]
    assert late.spans.counts.tolist() == [4, 3, 3] and late.spans.tokens.tolist() == [16, 16, 16]
    assert late.spans.firsts.tolist() == [0, 4, 8, 12, 4, 8, 12, 4, 8, 12]


def test_the_vectors_come_back_in_chunk_order_one_per_chunk():
    texts = [WORDS]
    late, _ = plan(texts, _layout(texts, [[(4 * k, 4 * k + 4) for k in range(10)]], room=16))
    ragged = [np.full((n, 2), w, np.float32) for w, n in enumerate(late.spans.counts.tolist())]
    assert chunk_rows(ragged, late)[:, 0].tolist() == [0] * 4 + [1] * 3 + [2] * 3
    with pytest.raises(ApiError) as err:
        chunk_rows([*ragged[:2], ragged[2][:2]], late)
    assert err.value.code is ErrorCode.INTERNAL


def test_a_layout_that_does_not_say_its_room_is_refused():
    with pytest.raises(ApiError) as err:
        plan(["a b"], _layout(["a b"], [[(0, 2)]], room=0))
    assert err.value.code is ErrorCode.INTERNAL and "upgrade it" in err.value.message


@pytest.mark.parametrize(
    "worker, message",
    [
        (
            {"task": "score", "outputs": "dense"},
            "late chunking pools an embedder's token vectors; m is a cross-encoder",
        ),
        (
            {"task": "embed", "outputs": "sparse"},
            "late chunking pools token vectors into dense vectors; m makes no dense",
        ),
    ],
    ids=["reranker", "sparse-only"],
)
def test_models_without_token_vectors_to_pool_are_refused(worker, message):
    with pytest.raises(ApiError) as err:
        check_model("m", worker)
    assert (err.value.code, err.value.status, err.value.param) == (ErrorCode.INVALID_REQUEST, 400, "chunking.late")
    assert err.value.message.startswith(message), err.value.message
    check_model("m", {"task": "embed", "outputs": "dense,multivector"})
    check_model("m", {})  # a worker of a release before outputs were said: dense
