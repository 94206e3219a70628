"""The engine's errors: a batch it cannot take, and the row at fault (its index in the batch).

The engine knows nothing of the wire; the worker answers each as a wire error (``service.wire_error``).
"""

from __future__ import annotations

import numpy as np


class EngineError(Exception):
    """A batch the model cannot take. ``message`` is said of row ``row``: "has 300 tokens; ..."."""

    def __init__(self, row: int, message: str) -> None:
        super().__init__(f"row {row} {message}")
        self.row = row
        self.message = message


class InvalidTokens(EngineError):
    """A row holds token ids (or token types) outside what the model embeds."""


class InputTooLong(EngineError):
    """A row is longer than the model's limit."""


def row_of(cu_seqlens: np.ndarray, position: int) -> int:
    """The row that holds token ``position`` of a packed batch (cu_seqlens: [B + 1])."""
    return int(np.searchsorted(cu_seqlens, position, side="right")) - 1


class InvalidSpans(EngineError):
    """A row's spans do not lie within it (or it has more spans than tokens)."""
