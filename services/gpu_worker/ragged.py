"""Results with a varying number of entries per input: sparse vectors as (index, value) pairs, and a
vector per token. Pure numpy: the worker's reply path and bulk answers both use these."""

from __future__ import annotations

import numpy as np


def sparse_rows(
    dense: np.ndarray, threshold: float | None = None, top_k: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[n, vocab] float32 -> (offsets [n + 1] int32, indices [entries] int32, values [entries] float32).

    An entry is kept when its value is above ``threshold`` and above 0 (the zeros a sparse vector is
    made of are never sent); with ``top_k``, only a row's k largest (ties: the lower index first). Indices ascend within a row.
    """
    keep = dense > max(float(threshold or 0.0), 0.0)
    if top_k is not None and top_k < dense.shape[1]:
        over = keep.sum(axis=1) > top_k
        if over.any():
            rows = np.flatnonzero(over)
            # stable sort of -value: among equal values the lower index wins
            order = np.argsort(-dense[rows], axis=1, kind="stable")[:, :top_k]
            kept = np.zeros((len(rows), dense.shape[1]), dtype=bool)
            np.put_along_axis(kept, order, True, axis=1)
            keep[rows] &= kept
    counts = keep.sum(axis=1)
    offsets = np.zeros(len(dense) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    rows_idx, cols = np.nonzero(keep)  # row-major: each row's indices ascending
    return offsets, cols.astype(np.int32), dense[rows_idx, cols].astype(np.float32)


def token_rows(
    vectors: np.ndarray,
    input_ids: np.ndarray,
    cu_seqlens: np.ndarray,
    skip_first: bool = False,
    drop_ids: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-token vectors [T, d] of the rows cu_seqlens describes -> (offsets [n + 1] int32, kept rows).

    ``skip_first``: each row's first token has no vector (BGE-M3's colbert vectors start after CLS);
    ``drop_ids``: tokens with these ids have none (a multi-vector encoder's skiplist).
    """
    keep = np.ones(len(vectors), dtype=bool)
    if skip_first:
        keep[cu_seqlens[:-1][np.diff(cu_seqlens) > 0]] = False
    if drop_ids is not None and len(drop_ids):
        keep &= ~np.isin(input_ids, drop_ids)
    row_of = np.repeat(np.arange(len(cu_seqlens) - 1), np.diff(cu_seqlens))
    counts = np.bincount(row_of[keep], minlength=len(cu_seqlens) - 1)
    offsets = np.zeros(len(cu_seqlens), dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return offsets, vectors[keep]


def split_inputs(offsets: np.ndarray, entry_bytes: int, budget: int) -> list[tuple[int, int]]:
    """Group consecutive inputs into parts whose entries take at most ``budget`` bytes each; an input
    too large for one part alone raises ValueError naming its size."""
    sizes = np.diff(offsets.astype(np.int64)) * entry_bytes
    parts: list[tuple[int, int]] = []
    start, used = 0, 0
    for i, size in enumerate(sizes.tolist()):
        if size > budget:
            raise ValueError(f"input {i} makes {size} bytes of vectors, over the {budget} bytes one message holds")
        if used + size > budget and i > start:
            parts.append((start, i))
            start, used = i, 0
        used += size
    parts.append((start, len(sizes)))
    return parts
