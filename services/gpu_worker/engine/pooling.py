"""Pooling of packed hidden states into one vector per sequence, and output post-processing."""

from __future__ import annotations

import numpy as np
import torch


def pool(hidden: torch.Tensor, cu_seqlens: torch.Tensor, lengths: torch.Tensor, mode: str) -> torch.Tensor:
    """hidden [T, H], cu_seqlens [B + 1], lengths [B] -> [B, H]."""
    if mode == "cls":
        return hidden[cu_seqlens[:-1]]
    if mode == "lasttoken":
        return hidden[cu_seqlens[1:] - 1]
    if mode == "mean":
        seq = torch.repeat_interleave(torch.arange(len(lengths), device=hidden.device), lengths)
        sums = torch.zeros(len(lengths), hidden.shape[1], dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, seq, hidden.float())
        return sums / lengths.unsqueeze(1).to(sums.dtype)
    raise ValueError(f"unknown pooling mode {mode!r}")


def postprocess(vectors: np.ndarray, normalize: bool, dimensions: int | None, dtype: np.dtype) -> np.ndarray:
    """[B, H] float32 -> [B, dimensions or H] in ``dtype``: Matryoshka truncation, then L2 norm."""
    if dimensions is not None and dimensions < vectors.shape[1]:
        vectors = vectors[:, :dimensions]
    if normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(vectors, dtype=dtype)
