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
from typing import TYPE_CHECKING, Any

import numpy as np

from embedfleet.services.gateway.errors import ApiError
from embedfleet.services.gateway.inputs import Inputs
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.protocol import ChunkLayout
from embedfleet.shared.text_chunks import BOUNDARIES, ChunkSpec, TextChunk

if TYPE_CHECKING:  # the typed body imports nothing of this module, but keeps it free of pydantic
    from embedfleet.services.gateway.openai_body import ChunkingBody

RETURNS = ("chunks", "mean")
_KEYS = ("size", "overlap", "boundary", "late", "return")
JOB_KEYS = _KEYS[:4]  # a bulk job's chunking: a vector a chunk, always


@dataclass(frozen=True, slots=True)
class Chunking:
    spec: ChunkSpec
    late: bool = False
    returns: str = "chunks"


def parse_chunking(doc: dict[str, Any], param: str = "chunking", keys: tuple[str, ...] = _KEYS) -> Chunking | None:
    """The request's ``chunking`` object (None when absent), of ``keys`` at most; refused in the route's
    error shape when its keys or values are wrong."""
    raw = doc.get(param)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"'{param}' must be an object with 'size' and optionally {', '.join(repr(k) for k in keys[1:])}",
            param,
        )
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"'{param}' has unknown keys {', '.join(map(repr, unknown))}: it takes {', '.join(map(repr, keys))}",
            param,
        )
    if "size" not in raw:
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"'{param}.size' is required: the most tokens of text a chunk holds",
            f"{param}.size",
        )
    late, returns = raw.get("late", False), raw.get("return", "chunks")
    if not isinstance(late, bool):
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'{param}.late' must be true or false", f"{param}.late")
    if returns not in RETURNS:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'{param}.return' must be 'chunks' or 'mean'", f"{param}.return")
    boundary = raw.get("boundary", "token")
    if not isinstance(boundary, str) or boundary not in BOUNDARIES:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, f"'{param}.boundary' must be 'token' or 'sentence'", f"{param}.boundary"
        )
    try:
        spec = ChunkSpec(raw["size"], raw.get("overlap", 0), boundary)
    except ServiceError as exc:
        raise ApiError(exc.code, exc.message, param) from None
    return Chunking(spec, late, returns)


def parse_text_chunking(doc: dict[str, Any], inputs: Inputs, field: str) -> Chunking | None:
    """``parse_chunking`` on a route whose inputs are in ``field``: inputs given as token IDs have no
    text to cut, and are refused."""
    chunking = parse_chunking(doc)
    if chunking is not None and inputs.token_ids is not None:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, f"'chunking' cuts texts: give '{field}' as text, not token IDs", "chunking"
        )
    return chunking


def body_chunking(body: ChunkingBody, inputs: Inputs, field: str) -> Chunking:
    """A typed body's validated ``chunking`` on a route whose inputs are in ``field`` (token IDs have no
    text to cut: refused), its size and overlap checked together."""
    if inputs.token_ids is not None:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, f"'chunking' cuts texts: give '{field}' as text, not token IDs", "chunking"
        )
    try:
        return Chunking(ChunkSpec(body.size, body.overlap, body.boundary), body.late, body.returns)
    except ServiceError as exc:
        raise ApiError(exc.code, exc.message, "chunking") from None


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
