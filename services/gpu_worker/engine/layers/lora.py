"""Task adapters (LoRA) applied per row of one packed batch.

A model with task adapters (jina-embeddings-v3's retrieval.query, retrieval.passage, ...) holds, for
each adapted layer, every adapter's low-rank pair stacked: A [n * r, in] (adapter i's rows at i * r)
and B [out, n * r] (its columns at i * r, the scale alpha / r folded in). A batch names each token's
adapter (``batch.adapters``: 0 for none, i for the model's i-th), turned once per forward into a mask
[T, n * r] of ones on the token's own adapter's r columns; then every adapted layer adds

    delta = ((x @ A^T) * mask) @ B^T

to its output: two thin GEMMs whatever mix of tasks the batch holds, the same shapes for every batch
of a size (CUDA graphs replay it), and no adapter merged into the base weights, so requests of
different tasks share one forward. With r = 4 and five adapters the extra work is 2 x 20 columns
beside a layer's hundreds: a few percent.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def adapter_mask(adapters: torch.Tensor, count: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """[T] adapter index per token (0: none, 1..count) -> [T, count * rank] mask in ``dtype``."""
    one_hot = F.one_hot(adapters.clamp(0, count), count + 1)[:, 1:]  # [T, count]
    return one_hot.to(dtype).repeat_interleave(rank, dim=1)


class LinearAdapters(nn.Module):
    """A linear layer's adapters: ``forward`` gives the delta its output gains, [T, out]."""

    def __init__(self, in_features: int, out_features: int, count: int, rank: int) -> None:
        super().__init__()
        self.count, self.rank = count, rank
        self.a = nn.Parameter(torch.zeros(count * rank, in_features), requires_grad=False)
        self.b = nn.Parameter(torch.zeros(out_features, count * rank), requires_grad=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(x, self.a) * mask, self.b)


class EmbeddingAdapters(nn.Module):
    """An embedding table's adapters: row ``id`` of the table gains A_i[id] @ B_i (A [vocab, r] per
    adapter, stacked as [vocab, n * r]; B [n * r, dim] with the scale folded in)."""

    def __init__(self, num_embeddings: int, dim: int, count: int, rank: int) -> None:
        super().__init__()
        self.count, self.rank = count, rank
        self.a = nn.Parameter(torch.zeros(num_embeddings, count * rank), requires_grad=False)
        self.b = nn.Parameter(torch.zeros(count * rank, dim), requires_grad=False)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (self.a[ids] * mask) @ self.b


def stack_linear(
    a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Adapters' own pairs, A_i [r, in] and B_i [out, r], as ``LinearAdapters`` holds them: A [n * r, in]
    and scale * B [out, n * r] (adapter i at rows / columns i * r)."""
    return torch.cat(list(a), dim=0), torch.cat(list(b), dim=1) * scale


def stack_embedding(
    a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Embedding adapters' pairs, A_i [vocab, r] and B_i [r, dim], as ``EmbeddingAdapters`` holds them."""
    return torch.cat(list(a), dim=1), torch.cat(list(b), dim=0) * scale
