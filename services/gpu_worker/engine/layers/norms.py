"""Normalisation layers over [..., hidden] activations."""

from __future__ import annotations

import math

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 (Llama, Qwen, Mistral).

    ``offset``: Gemma stores the scale as w - 1 and multiplies in float32 before casting back
    ((x * (1 + w)).to(dtype)); Llama casts first (x.to(dtype) * w). Both orders are kept exactly.
    """

    def __init__(self, dim: int, eps: float, offset: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # rsqrt(mean(x^2) + eps) as sqrt(d) / sqrt(|x|^2 + d * eps): one reduction kernel, several
        # times faster on CPU than pow + mean for short rows (per-head q/k norms)
        x32 = x.float()
        d = x.shape[-1]
        scale = (
            torch.linalg.vector_norm(x32, dim=-1, keepdim=True).square_().add_(d * self.eps).rsqrt_().mul_(math.sqrt(d))
        )
        normed = x32 * scale
        if self.offset:
            return normed.mul_(1.0 + self.weight.float()).to(x.dtype)
        return self.weight * normed.to(x.dtype)
