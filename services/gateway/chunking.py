"""The ``chunking`` option of the embedding routes: its parsing, and what the gateway makes of a layout.

A request with ``chunking`` is answered in two hops: a tokenizer says where each input's chunks fall
(``EmbedClient.chunk``), then the chunks' texts are embedded as an ordinary request (packing, workers
and resends as for any input). ``"return": "chunks"`` answers a vector per chunk with its offsets;
``"mean"`` a vector per input: the mean of its chunks' vectors weighted by their tokens, normalised
again when the request's vectors are (the model's rule, or TEI's ``normalize``). ``"late": true`` embeds
the same chunks from windows of the texts instead, each chunk pooled from the token states of the text
around it (late_chunking.py).

The routes taking it (``/v1/embeddings``, TEI's ``/embed``, Cohere's ``/v2/embed``) parse it here, embed
through ``Gateway.run_chunked`` and name each chunk row with ``chunk_places``; only the answer's shape
is theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Inputs
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.protocol import ChunkLayout
from embedfleet.shared.text_chunks import ChunkSpec, TextChunk

if TYPE_CHECKING:
    from embedfleet.services.gateway.openai.body import ChunkingBody

RETURNS = ("chunks", "mean")


@dataclass(frozen=True, slots=True)
class Chunking:
    spec: ChunkSpec
    late: bool = False
    returns: str = "chunks"


def chunking_of(body: ChunkingBody) -> Chunking:
    """A typed body's validated ``chunking`` object as the gateway's; its sizes' agreement (overlap below
    size) checked as ChunkSpec checks it."""
    try:
        return Chunking(ChunkSpec(body.size, body.overlap, body.boundary), body.late, body.returns)
    except ServiceError as exc:
        raise ApiError(exc.code, exc.message, "chunking") from None


def body_chunking(body: ChunkingBody, inputs: Inputs, field: str) -> Chunking:
    """A typed body's validated ``chunking`` on a route whose inputs are in ``field`` (token IDs have no
    text to cut: refused), its size and overlap checked together."""
    if inputs.token_ids is not None:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, f"'chunking' cuts texts: give '{field}' as text, not token IDs", "chunking"
        )
    return chunking_of(body)


def chunk_places(chunks: list[list[TextChunk]]) -> list[dict[str, int]]:
    """Where each chunk row lies, input by input (the rows' order): its input's ``index``, its number
    ``chunk`` within the input, and its characters ``start`` and ``end`` (``input[start:end]``)."""
    return [
        {"index": i, "chunk": k, "start": c.start, "end": c.end}
        for i, cs in enumerate(chunks)
        for k, c in enumerate(cs)
    ]


def chunk_texts(texts: list[str], layout: ChunkLayout) -> tuple[list[str], list[list[TextChunk]]]:
    """Every chunk's text, input by input, and each input's chunks."""
    chunks = layout.chunks()
    return [text[c.start : c.end] for text, cs in zip(texts, chunks) for c in cs], chunks


def mean_of_chunks(vectors: np.ndarray, chunks: list[list[TextChunk]], normalize: bool) -> np.ndarray:
    """[inputs, dim] float32: each input's chunk vectors (rows of ``vectors``, input by input) averaged,
    weighted by their tokens (an input whose chunks hold none: equally), then L2-normalised when
    ``normalize``."""
    out = np.empty((len(chunks), vectors.shape[1]), dtype=np.float32)
    row = 0
    for i, cs in enumerate(chunks):
        weights = np.array([c.tokens for c in cs], dtype=np.float64)
        if not weights.sum():
            weights[:] = 1.0
        out[i] = (weights @ vectors[row : row + len(cs)].astype(np.float64)) / weights.sum()
        row += len(cs)
    if normalize:
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out
