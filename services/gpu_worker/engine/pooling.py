"""Pooling of packed hidden states into one vector per row, and output post-processing.

The modes follow sentence-transformers' Pooling module on unpadded (flattened) input. With
``masked`` (a model whose Pooling has include_prompt=false), each row's leading prompt tokens are
not counted: the batch's ``keep`` [N] is 0 for them and ``kept`` [R] counts the rest; ``first``
already points past them. The flag is the model's, fixed for an engine, so a graph captures one path.
"""

from __future__ import annotations

import numpy as np
import torch

from embedfleet.shared.model_dir.stack import POOLING_MODES

__all__ = ["POOLING_MODES", "pool", "postprocess"]


def pool(hidden: torch.Tensor, batch, mode: str, masked: bool = False) -> torch.Tensor:
    """hidden [N, H] -> [R, H] float32, using the batch's seq_ids / first / last / lengths / cu_seqlens.

    Shapes depend only on N and R (no host sync), so pooling can sit inside a CUDA graph. A padded
    batch's pad tokens belong to a dummy row, and zero-length rows follow it: their outputs are
    discarded, but stay finite (lengths are >= 1 and empty rows pool to zeros).
    """
    if mode == "cls":
        return hidden[batch.first].float()
    if mode == "lasttoken":
        return hidden[batch.last].float()
    values = hidden.float()
    keep = batch.keep.unsqueeze(1) if masked else None  # [N, 1]
    if mode == "max":
        # include_self=False: a row no token reaches keeps the zero it starts with (no -inf)
        index = batch.seq_ids.unsqueeze(1).expand(-1, hidden.shape[1])  # [N, H]
        if keep is not None:
            values = values.masked_fill(keep == 0, float("-inf"))
        return _zeros(batch, hidden).scatter_reduce_(0, index, values, reduce="amax", include_self=False)
    lengths = (batch.kept if masked else batch.lengths).unsqueeze(1)  # [R, 1] float32, >= 1
    if keep is not None:
        values = values * keep
    if mode == "mean":
        return _row_sums(values, batch) / lengths
    if mode == "mean_sqrt_len":
        return _row_sums(values, batch) / lengths.sqrt()
    if mode == "weightedmean":
        # token i of a row (0-based) weighs i + 1 (a skipped prompt keeps the others' weights)
        tokens = torch.arange(hidden.shape[0], device=hidden.device)
        weights = (tokens - batch.cu_seqlens[batch.seq_ids] + 1).to(torch.float32).unsqueeze(1)  # [N, 1]
        if keep is None:  # the weights of a row of L tokens sum to L (L + 1) / 2
            return _row_sums(values * weights, batch) / (lengths * (lengths + 1) / 2)
        weights = weights * keep
        return _row_sums(values * weights, batch) / _row_sums(weights, batch).clamp(min=1e-9)
    raise ValueError(f"unknown pooling mode {mode!r}")


def _zeros(batch, hidden: torch.Tensor) -> torch.Tensor:
    return torch.zeros(batch.lengths.shape[0], hidden.shape[1], dtype=torch.float32, device=hidden.device)


def _row_sums(values: torch.Tensor, batch) -> torch.Tensor:
    """values [N, H] float32 -> [R, H]: the sum over each row's tokens."""
    return _zeros(batch, values).index_add_(0, batch.seq_ids, values)


def postprocess(vectors: np.ndarray, normalize: bool, dimensions: int | None, dtype: np.dtype) -> np.ndarray:
    """[B, H] float32 -> [B, dimensions or H] in ``dtype``: Matryoshka truncation, then L2 norm."""
    if dimensions is not None and dimensions < vectors.shape[1]:
        vectors = vectors[:, :dimensions]
    if normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(vectors, dtype=dtype)
