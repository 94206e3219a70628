"""Pooling of packed hidden states into one vector per row, and output post-processing."""

from __future__ import annotations

import numpy as np
import torch

POOLING_MODES = ("mean", "cls", "lasttoken")


def pool(hidden: torch.Tensor, batch, mode: str) -> torch.Tensor:
    """hidden [N, H] -> [R, H] float32, using the batch's seq_ids / first / last / lengths.

    Shapes depend only on N and R (no host sync), so pooling can sit inside a CUDA graph.
    """
    if mode == "cls":
        return hidden[batch.first].float()
    if mode == "lasttoken":
        return hidden[batch.last].float()
    if mode == "mean":
        rows = batch.lengths.shape[0]
        sums = torch.zeros(rows, hidden.shape[1], dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, batch.seq_ids, hidden.float())
        return sums / batch.lengths.unsqueeze(1)
    raise ValueError(f"unknown pooling mode {mode!r}")


def postprocess(vectors: np.ndarray, normalize: bool, dimensions: int | None, dtype: np.dtype) -> np.ndarray:
    """[B, H] float32 -> [B, dimensions or H] in ``dtype``: Matryoshka truncation, then L2 norm."""
    if dimensions is not None and dimensions < vectors.shape[1]:
        vectors = vectors[:, :dimensions]
    if normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(vectors, dtype=dtype)
