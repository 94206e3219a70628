"""How texts are asked cut into chunks (``ChunkSpec``), and where a cut chunk lies (``TextChunk``).

Shared by the gateway, the client and the protocol, which check a request's chunking once, here, and by
the tokenizer, which cuts (services/tokenizer/chunking.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from embedfleet.shared.errors import ErrorCode, ServiceError, shown

BOUNDARIES = ("token", "sentence")


@dataclass(frozen=True, slots=True)
class TextChunk:
    start: int  # characters: text[start:end] is the chunk's text
    end: int
    first: int  # content-token indices within the whole text: tokens [first, last)
    last: int

    @property
    def tokens(self) -> int:
        return self.last - self.first


@dataclass(frozen=True, slots=True)
class ChunkSpec:
    """How a request asks its inputs cut: ``size`` content tokens a window at most, ``overlap`` tokens
    shared by consecutive windows at most, cuts at words (``"token"``) or sentence ends (``"sentence"``)."""

    size: int
    overlap: int = 0
    boundary: str = "token"

    def __post_init__(self) -> None:
        if not _is_int(self.size) or self.size < 1:
            raise _invalid(f"chunking.size must be an integer of at least 1, got {shown(self.size)}")
        if not _is_int(self.overlap) or self.overlap < 0:
            raise _invalid(f"chunking.overlap must be an integer of at least 0, got {shown(self.overlap)}")
        if self.overlap >= self.size:
            raise _invalid(f"chunking.overlap ({self.overlap}) must be less than chunking.size ({self.size})")
        if self.boundary not in BOUNDARIES:
            raise _invalid(f"chunking.boundary must be 'token' or 'sentence', got {shown(self.boundary)}")

    def most_chunks(self, chars: int) -> int:
        """The chunks a text of ``chars`` characters makes at one token a character, its windows full:
        the first ``size`` characters, each after ``size - overlap`` more. Arithmetic, before anything is
        tokenized: a token covers a character or more in nearly all text, so the cut rarely makes more."""
        if chars <= self.size:
            return 1
        return 1 + -(-(chars - self.size) // (self.size - self.overlap))

    def check_room(self, room: int) -> None:
        """Refuses a ``size`` over ``room``: the content tokens a sequence holds besides the model's
        special tokens and the prompt."""
        if self.size > room:
            raise _invalid(
                f"chunking.size is {self.size}; this model holds at most {room} tokens of text a chunk "
                "(its limit, less its special tokens and the prompt)"
            )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _invalid(message: str) -> ServiceError:
    return ServiceError(ErrorCode.INVALID_REQUEST, message)


@dataclass(frozen=True, slots=True)
class JobChunking:
    """How a bulk job cuts its documents: into ``spec``'s chunks, each embedded alone (``late``: the
    document read in windows of the model's room, one forward each, its token states pooled over each
    chunk: services/tokenizer/bulk_chunks.py); and whether each chunk's text is stored beside its
    vector (``with_text``)."""

    spec: ChunkSpec
    late: bool = False
    with_text: bool = False

    def __post_init__(self) -> None:
        for name in ("late", "with_text"):
            if not isinstance(getattr(self, name), bool):
                raise _invalid(f"chunking.{name} must be true or false")

    def record(self) -> dict:
        """As a job's state records it (and the job's id and request digest are made of it)."""
        return {
            "size": self.spec.size,
            "overlap": self.spec.overlap,
            "boundary": self.spec.boundary,
            "late": self.late,
            "with_text": self.with_text,
        }
