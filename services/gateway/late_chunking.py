"""Late chunking on POST /v1/embeddings (``"chunking": {"late": true}``): each chunk's vector pooled from
one forward pass over the text around it, not from its own text alone (Günther et al., 2024).

The chunks are the plain chunking's (the same layout hop, the same offsets). Each input's chunks are
grouped into windows of the model's room (shared/chunk_windows.py: the whole text when it fits); the
windows' texts are embedded as one request for the output "spans", each with the spans of the chunks
it owns, and the worker answers a vector per span: the mean of the chunk's content-token states, then
the model's Dense layers and normalisation. The vectors come back window by window, so in input then
chunk order, and are rendered as plain chunking's are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.shared.chunk_windows import late_windows
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.protocol import ChunkLayout, Spans
from embedfleet.shared.text_chunks import TextChunk


@dataclass(frozen=True, slots=True)
class LatePlan:
    texts: list[str]  # each window's text
    inputs: list[int]  # the input each window is of
    spans: Spans  # per window, the chunks it owns, in its content tokens (from its first token)


def check_model(model: str, worker: dict[str, str]) -> None:
    """Refuses a model with no token states to pool into embeddings (``worker``: its discovery metadata)."""
    if worker.get("task") == "score":
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"late chunking pools an embedder's token vectors; {model} is a "
            "cross-encoder, which scores (query, document) pairs and makes none",
            "chunking.late",
        )
    if "dense" not in (worker.get("outputs") or "dense").split(","):
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"late chunking pools token vectors into dense vectors; {model} makes no dense vectors",
            "chunking.late",
        )


def plan(texts: list[str], layout: ChunkLayout) -> tuple[LatePlan, list[list[TextChunk]]]:
    """The windows to embed for ``texts`` cut as ``layout`` says, and each input's chunks."""
    if layout.room <= 0:
        raise ApiError(
            ErrorCode.INTERNAL,
            "the tokenizer that cut the texts does not say how many tokens a window "
            "holds (a release before late chunking): upgrade it",
        )
    chunks = layout.chunks()
    windows, inputs, rows, tokens = [], [], [], []
    for i, (text, cs) in enumerate(zip(texts, chunks)):
        for w in late_windows(cs, layout.room):
            whole = w.first == 0 and w.end == len(cs)
            windows.append(text if whole else text[cs[w.first].start : cs[w.end - 1].end])
            inputs.append(i)
            base = cs[w.first].first
            rows.append([(c.first - base, c.last - base) for c in cs[w.own : w.end]])
            tokens.append(w.tokens(cs))
    return LatePlan(windows, inputs, Spans.of(rows, tokens)), chunks


def chunk_rows(ragged: list[np.ndarray], late: LatePlan) -> np.ndarray:
    """[chunks, width]: each window's span vectors (``ragged``, window by window), one per chunk it owns."""
    if [len(r) for r in ragged] != late.spans.counts.tolist():
        raise ApiError(ErrorCode.INTERNAL, "a worker answered other than a vector per chunk")
    return np.concatenate(ragged)
