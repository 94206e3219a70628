"""Late chunking's windows (shared/chunk_windows.py): a text that fits is one window; a longer one is
read in windows of at most the room, each chunk owned by one window that holds it whole, the windows
after the first reaching back over whole chunks for context."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedfleet.shared.chunk_windows import CONTEXT_SHARE, Window, late_windows
from embedfleet.shared.text_chunks import TextChunk


def _chunks(bounds: list[tuple[int, int]]) -> list[TextChunk]:
    """Chunks of the given token bounds, 5 characters a token."""
    return [TextChunk(5 * a, 5 * b - 1, a, b) for a, b in bounds]


def test_an_input_that_fits_is_one_window_of_all_its_chunks():
    chunks = _chunks([(0, 60), (50, 120), (110, 254)])
    assert late_windows(chunks, 254) == [Window(0, 0, 3)]
    assert late_windows(_chunks([(0, 0)]), 254) == [Window(0, 0, 1)]  # a text without tokens


def test_a_long_input_is_read_in_windows_with_context_before_their_chunks():
    chunks = _chunks([(50 * k, 50 * k + 50) for k in range(12)])  # 600 tokens, chunks of 50
    windows = late_windows(chunks, 254)
    # the first owns 5 chunks (250 tokens); the next own 3 (150 <= 254 - 63) and reach back 2 (100 tokens)
    assert windows == [Window(0, 0, 5), Window(3, 5, 8), Window(6, 8, 11), Window(7, 11, 12)]
    assert [w.tokens(chunks) for w in windows] == [250, 250, 250, 250]  # the last reaches back 4


def test_chunks_as_large_as_the_room_have_a_window_each_and_no_context():
    chunks = _chunks([(0, 254), (254, 508), (508, 600)])
    assert late_windows(chunks, 254) == [Window(0, 0, 1), Window(1, 1, 2), Window(2, 2, 3)]


def test_a_chunk_over_the_room_is_a_mistake():
    with pytest.raises(ValueError):
        late_windows(_chunks([(0, 300)]), 254)


@st.composite
def cut_inputs(draw) -> tuple[list[TextChunk], int]:
    """Chunks as a cut makes them: each starts and ends after the one before, at most ``size`` tokens,
    consecutive ones sharing at most ``overlap``, covering the input; and a room at least ``size``."""
    size = draw(st.integers(1, 64))
    overlap = draw(st.integers(0, size - 1))
    room = draw(st.integers(size, 160))
    total = draw(st.integers(1, 900))
    bounds, first = [], 0
    while True:
        last = min(total, first + draw(st.integers(1, size)))
        bounds.append((first, last))
        if last == total:
            return _chunks(bounds), room
        first = draw(st.integers(max(first + 1, last - overlap), last))


@settings(max_examples=300, deadline=None)
@given(cut_inputs())
def test_every_chunk_is_owned_once_by_a_window_that_holds_it_and_the_context_is_as_large_as_fits(cut):
    chunks, room = cut
    windows = late_windows(chunks, room)
    owned = [i for w in windows for i in range(w.own, w.end)]
    assert owned == list(range(len(chunks)))  # each chunk once, in order
    budget = room - room // CONTEXT_SHARE
    for k, w in enumerate(windows):
        assert 0 <= w.first <= w.own < w.end <= len(chunks)
        assert w.tokens(chunks) <= room
        owns = chunks[w.end - 1].last - chunks[w.own].first
        if w.end < len(chunks):  # it owns as many as its budget takes
            assert chunks[w.end].last - chunks[w.own].first > (room if k == 0 else budget)
        if k > 0:
            assert owns <= budget or w.end == w.own + 1
            assert w.first == 0 or chunks[w.end - 1].last - chunks[w.first - 1].first > room  # as far back as fits
        else:
            assert w.first == 0
    if chunks[-1].last <= room:
        assert windows == [Window(0, 0, len(chunks))]
