"""A vector per span: each span of a row's tokens mean-pooled from one forward pass (late chunking).

The facility "a sequence with spans -> a vector per span": a row of a packed batch carries the spans
(shared/protocol/spans.py, in the row's own token positions) of the chunks it holds; the encoder runs
once over the whole row, so each chunk's token states saw the text around it, and each span's vector
is the mean of its tokens' last hidden states. The model's Dense layers then apply to it as to a
pooled vector (the engine's ``dense``). Whatever the model's own pooling, a span's vector is a mean:
late chunking pools the chunk's tokens, never the special tokens or a prompt (the tokenizer places
the spans past them).

Spans may overlap (chunks cut with overlap share tokens) and need not cover their row. The sums come
from one running sum over the batch's tokens (float64: a difference of two large float32 sums would
lose the small one's digits), so a span costs two rows of it, whatever its length; no loop per span.
"""

from __future__ import annotations

import numpy as np
import torch

from embedfleet.services.gpu_worker.engine.errors import InvalidSpans
from embedfleet.shared.protocol.spans import Spans, span_fault


def check_spans(spans: Spans, cu_seqlens: np.ndarray) -> None:
    """Refuse spans that do not fit their batch (untrusted): one count per row, each span 0 <= first <
    last <= its row's length, no more spans than tokens in a row (a row with none is allowed: its work
    asked for another output). Raises InvalidSpans naming the first row at fault."""
    lengths = np.diff(np.asarray(cu_seqlens, dtype=np.int64))
    fault = span_fault(spans.counts, spans.firsts, spans.lasts, lengths, least=0)
    if fault is not None:
        row, what = fault
        raise InvalidSpans(0 if row is None else row, what)


def span_positions(spans: Spans, cu_seqlens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each span's tokens in the packed batch: ([S] first, [S] end) int64, from row-relative bounds."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    base = np.repeat(cu[:-1], spans.counts)
    return base + spans.firsts, base + spans.lasts


def span_means(hidden: torch.Tensor, firsts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """hidden [N, H] -> [S, H] float32: the mean of hidden[firsts[j]:ends[j]] for each span j
    (firsts, ends: [S] int64 on hidden's device, firsts < ends <= N)."""
    sums = torch.zeros(hidden.shape[0] + 1, hidden.shape[1], dtype=torch.float64, device=hidden.device)
    torch.cumsum(hidden.to(torch.float64), dim=0, out=sums[1:])  # sums[i]: the first i tokens' sum
    counts = (ends - firsts).to(torch.float64).unsqueeze(1)  # [S, 1]
    return ((sums[ends] - sums[firsts]) / counts).to(torch.float32)
