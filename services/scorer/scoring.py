"""Relevance scores and ranking: cosine for bi-encoders, sigmoid of a cross-encoder's logit."""

from __future__ import annotations

import numpy as np


def cosine_rank(query: np.ndarray, candidates: np.ndarray, top_n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """query [dim], candidates [n, dim] -> (indices best first [k] int32, scores [k] float32).

    Ties keep input order (stable sort), so equal candidates rank as they were given. Scores lie in
    [-1, 1]: float32 rounding gives a vector 1.0000001 with itself, which a client may check against 1.
    """
    q = query.astype(np.float32) / max(float(np.linalg.norm(query)), 1e-12)
    c = candidates.astype(np.float32)
    return rank(np.clip((c @ q) / np.maximum(np.linalg.norm(c, axis=1), 1e-12), -1.0, 1.0), top_n)


def rank(scores: np.ndarray, top_n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """scores [n] -> (indices best first [k] int32, their scores [k] float32); ties keep input order."""
    order = np.argsort(-scores, kind="stable")
    if top_n is not None:
        order = order[:top_n]
    return order.astype(np.int32), scores[order].astype(np.float32)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
