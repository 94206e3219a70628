"""Chunk layouts: where the texts of a ChunkRequest are cut (services/tokenizer/chunking.py), within the
room the model leaves a chunk and the service's limit on chunks a request. No NATS here."""

from __future__ import annotations

from itertools import accumulate

from embedfleet.services.tokenizer.chunking import cut
from embedfleet.services.tokenizer.encoder import TextEncoder, encode_all
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.protocol import ChunkLayout, ChunkRequest
from embedfleet.shared.text_chunks import TextChunk


class Layouts:
    """Cuts texts for one model: each encoded whole (no special tokens, no truncation) by a copy of its
    tokenizer made once, then cut into windows of the request's size."""

    def __init__(self, encoder: TextEncoder, max_chunks: int) -> None:
        self._encoder = encoder
        self._tokenizer = encoder.whole_text_tokenizer()
        self._max_chunks = max_chunks

    def check(self, request: ChunkRequest) -> None:
        """Refuses a window the model cannot hold with its special tokens and the request's prompt before
        it (and a prompt the model does not have): the chunks are embedded so."""
        request.spec.check_room(self._encoder.room(self._encoder.resolve(request.prompt_options)))

    def layout(self, request: ChunkRequest) -> ChunkLayout:
        """Where each text is cut; refused when the texts make more than ``max_chunks`` chunks. The layout
        says the room a sequence has (late chunking's windows hold that much text)."""
        encodings = encode_all(self._tokenizer, request.texts, add_special_tokens=False)
        cuts = [cut(t, e, request.spec, self._tokenizer) for t, e in zip(request.texts, encodings)]
        chunks: list[list[TextChunk]] = [list(c) for c in cuts]
        self._check_count(chunks)
        room = self._encoder.room(self._encoder.resolve(request.prompt_options))
        return ChunkLayout.of(request.id, chunks, [c[-1].last for c in cuts], room)

    def _check_count(self, chunks: list[list[TextChunk]]) -> None:
        """An error of the input that takes the request past the limit, naming what the texts make in all."""
        total = sum(map(len, chunks))
        if total <= self._max_chunks:
            return
        row = next(i for i, upto in enumerate(accumulate(map(len, chunks))) if upto > self._max_chunks)
        raise ServiceError(
            ErrorCode.INPUT_TOO_LONG,
            f"takes the request past {self._max_chunks} chunks, the most one may be cut into: its texts "
            f"make {total} (send fewer or shorter texts, or a larger chunking.size)",
            row,
        )
