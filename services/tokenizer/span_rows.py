"""Late chunking's rows: the spans an EmbedRequest gives in its texts' content tokens, placed in the
token sequences those texts make, past the special tokens and the prompt before them. No NATS here.

A text of such a request is a window cut from a longer text at chunk boundaries (between words), so
alone it tokenizes to the tokens it had in the whole text; the request says how many (``Spans.tokens``)
and a text that makes another number is refused, never pooled from shifted spans: a word cut inside
at the window's edge (one longer than the chunk size), or a tokenizer that adds a space before every
text, can tokenize otherwise alone.
"""

from __future__ import annotations

import numpy as np

from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.protocol import Spans

_DIFFERS = (
    "content tokens, where its spans count {want}: alone it tokenizes otherwise than within the whole text "
    "(a word cut inside at its edge?)"
)


def place_spans(spans: Spans, ids: list[list[int]], before: int, after: int) -> Spans:
    """``spans`` (content tokens of each row's text) as positions in each row's token sequence ``ids[i]``,
    which has ``before`` tokens before its content (special tokens, the prompt) and ``after`` after it.
    A text without tokens has one span (0, 0): it pools its whole sequence, all the text has. Raises
    ServiceError (invalid_request, the row) for a text that makes other than its spans' content tokens."""
    assert spans.tokens is not None, "an EmbedRequest's spans carry each row's content tokens"
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    content = lengths - before - after
    wrong = content != spans.tokens
    if wrong.any():
        row = int(np.argmax(wrong))
        raise ServiceError(
            ErrorCode.INVALID_REQUEST, f"makes {int(content[row])} " + _DIFFERS.format(want=int(spans.tokens[row])), row
        )
    firsts = spans.firsts.astype(np.int64) + before
    lasts = spans.lasts.astype(np.int64) + before
    empty = spans.firsts == spans.lasts
    if empty.any():
        firsts[empty] = 0
        lasts[empty] = np.repeat(lengths, spans.counts)[empty]
    return Spans(spans.counts, firsts.astype(np.int32), lasts.astype(np.int32))
