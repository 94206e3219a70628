"""Late chunking's windows: an input's chunks grouped into the stretches of its text that one forward
pass embeds, each chunk pooled in the one window that owns it.

A model reads at most ``room`` content tokens at once (its limit, less its special tokens and the
prompt). An input that fits is one window, its whole text: every chunk is pooled from the states of
the whole input. A longer input is read in windows that overlap, as the paper's long late chunking
reads it in macro chunks (Günther et al., 2024, "Late Chunking"), with window edges at chunk edges:

- a window is a run of consecutive chunks, its tokens from its first chunk's first token to its last
  chunk's last token, at most ``room`` of them; its text is the input's characters from its first
  chunk's start to its last chunk's end (cuts fall between words, so that text alone tokenizes to
  exactly those tokens);
- each chunk is owned by exactly one window, which holds it whole; consecutive windows own
  consecutive chunks; a window's chunks before the ones it owns are its left context, owned by the
  window before (their tokens are read twice);
- the first window owns the chunks from the input's start while they span at most ``room`` tokens;
  each later window owns the next chunks while they span at most ``room - room // CONTEXT_SHARE``
  tokens (at least one chunk), then reaches back over the whole chunks before them as far as
  ``room`` allows: at least a quarter of its room of context, where the chunks' sizes let whole
  chunks fit in it (a chunk of nearly ``room`` tokens has room for none).

Pure: the gateway groups a request's chunks with it, and a bulk job's chunking can too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from embedfleet.shared.text_chunks import TextChunk

# a later window keeps room // CONTEXT_SHARE tokens, at least, for the context before the chunks it owns
CONTEXT_SHARE = 4


@dataclass(frozen=True, slots=True)
class Window:
    first: int  # index of its first chunk: where its text and tokens begin (context up to ``own``)
    own: int  # index of the first chunk it owns
    end: int  # one past its last chunk: it owns chunks ``own`` .. ``end``

    def tokens(self, chunks: Sequence[TextChunk]) -> int:
        """Content tokens it holds."""
        return chunks[self.end - 1].last - chunks[self.first].first


def late_windows(chunks: Sequence[TextChunk], room: int) -> list[Window]:
    """The windows of one input's ``chunks`` (in order, as services/tokenizer/chunking.py cuts them, each
    of at most ``room`` tokens), by the rule above."""
    if any(c.tokens > room for c in chunks):
        raise ValueError(f"a chunk holds more than the {room} tokens a window holds")
    windows: list[Window] = []
    own = 0
    while own < len(chunks):
        budget = room if own == 0 else room - room // CONTEXT_SHARE
        end = own + 1
        while end < len(chunks) and chunks[end].last - chunks[own].first <= budget:
            end += 1
        first = own
        while first > 0 and chunks[end - 1].last - chunks[first - 1].first <= room:
            first -= 1
        windows.append(Window(first, own, end))
        own = end
    return windows
