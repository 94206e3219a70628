"""Bi-encoder relevance: cosine similarity between a query vector and candidate vectors."""

from __future__ import annotations

import numpy as np


def cosine_rank(query: np.ndarray, candidates: np.ndarray, top_n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """query [dim], candidates [n, dim] -> (indices best first [k] int32, scores [k] float32).

    Ties keep input order (stable sort), so equal candidates rank as they were given.
    """
    q = query.astype(np.float32) / max(float(np.linalg.norm(query)), 1e-12)
    c = candidates.astype(np.float32)
    scores = (c @ q) / np.maximum(np.linalg.norm(c, axis=1), 1e-12)
    order = np.argsort(-scores, kind="stable")
    if top_n is not None:
        order = order[:top_n]
    return order.astype(np.int32), scores[order].astype(np.float32)
