"""Chunk layouts: where the texts of a ChunkRequest are cut (services/tokenizer/chunking.py), within the
room the model leaves a chunk and the service's limits: characters a text (checked before anything is
tokenized) and chunks a request (counted text by text: the text that passes it is the last tokenized,
bounded_cuts.py). No NATS here."""

from __future__ import annotations

from embedfleet.services.tokenizer.bounded_cuts import chars_refusal, cuts, longest_over
from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.shared.config.registry import default
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.protocol import ChunkLayout, ChunkRequest
from embedfleet.shared.text_chunks import TextChunk


class Layouts:
    """Cuts texts for one model: each encoded whole (no special tokens, no truncation) by a copy of its
    tokenizer made once, then cut into windows of the request's size."""

    def __init__(self, encoder: TextEncoder, max_chunks: int, max_chars: int = default("max_document_chars")) -> None:
        self._encoder = encoder
        self._tokenizer = encoder.whole_text_tokenizer()
        self._max_chunks = max_chunks
        self._max_chars = max_chars

    def check(self, request: ChunkRequest) -> None:
        """Refuses a window the model cannot hold with its special tokens and the request's prompt before
        it (and a prompt the model does not have): the chunks are embedded so. And a text over the
        characters one may have, before anything is tokenized."""
        request.spec.check_room(self._encoder.room(self._encoder.resolve(request.prompt_options)))
        row = longest_over(request.texts, self._max_chars)
        if row is not None:
            raise ServiceError(ErrorCode.INPUT_TOO_LONG, chars_refusal(len(request.texts[row]), self._max_chars), row)

    def layout(self, request: ChunkRequest) -> ChunkLayout:
        """Where each text is cut; refused (``check`` passed) at the text that takes the request past
        ``max_chunks`` chunks, nothing after it tokenized. The layout says the room a sequence has (late
        chunking's windows hold that much text)."""
        chunks: list[list[TextChunk]] = []
        tokens: list[int] = []
        total = 0
        for row, text_chunks in enumerate(cuts(self._tokenizer, request.texts, request.spec)):
            total += len(text_chunks)
            if total > self._max_chunks:
                raise ServiceError(
                    ErrorCode.INPUT_TOO_LONG,
                    f"takes the request past {self._max_chunks} chunks, the most one may be cut into: its texts "
                    f"up to it make {total} (send fewer or shorter texts, or a larger chunking.size)",
                    row,
                )
            chunks.append(list(text_chunks))  # the chunks alone: the text's encoding is let go
            tokens.append(text_chunks[-1].last)
        room = self._encoder.room(self._encoder.resolve(request.prompt_options))
        return ChunkLayout.of(request.id, chunks, tokens, room)
