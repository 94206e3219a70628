"""Float rows made into each vector form (shared/vectors/forms.py declares the forms), and back.

The forms and their bytes per vector of dimension d:

- ``float32`` (4·d), ``float16`` (2·d): the components, little-endian.
- ``int8`` (d): each component scaled into -127..127 by one fixed rule (below), rounded, clipped.
- ``uint8`` (d): the same range mapped onto 0..255.
- ``binary`` (ceil(d/8)): one bit per component, 1 where it is > 0, packed 8 to a byte with the first
  component in the byte's highest bit, each byte shifted by -128 into int8 — as sentence-transformers'
  ``quantize_embeddings`` (and Cohere and infinity after it) define it.
- ``ubinary`` (ceil(d/8)): the same bits as uint8 bytes, unshifted.

How the int8 and uint8 ranges are set: a component x of a row v is mapped from the range
[-r·|v|, r·|v|] with r = min(1, 4 / sqrt(d)), so that a unit vector's components — which have a
typical size of 1 / sqrt(d) — use most of the 8 bits and only outliers beyond four times that size are
clipped. For normalised rows (the default) |v| = 1: the same scale for every vector, so the dot
products of quantized vectors rank as the float ones do, across requests and batches (no
calibration set, nothing that depends on what else was in the batch). Unnormalised rows get a range
from their own norm (their cosines are kept).
"""

from __future__ import annotations

import math

import numpy as np

from embedfleet.shared.vectors.forms import vector_form

CLIP_SIGMAS = 4.0  # components beyond this many times 1/sqrt(d) (times the row's norm) are clipped


def range_of(dim: int) -> float:
    """r: an int8 / uint8 row spans [-r·|v|, r·|v|]."""
    return min(1.0, CLIP_SIGMAS / math.sqrt(dim))


def quantize(vectors: np.ndarray, form: str) -> np.ndarray:
    """[n, d] float -> [n, width(d)] of the form's (shared/vectors/forms.py) element type."""
    kind = vector_form(form)
    v = np.asarray(vectors, dtype=np.float32)
    if v.ndim != 2:
        raise ValueError("vectors must be a 2-D array")
    if kind.floating:
        return v.astype(kind.dtype, copy=False)
    if kind.packed:
        bits = np.packbits(v > 0, axis=1)
        return (bits.astype(np.int16) - 128).astype(np.int8) if form == "binary" else bits
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    span = range_of(v.shape[1]) * np.where(norms > 0, norms, 1.0)  # [-span, span] per row
    if form == "int8":
        return np.clip(np.rint(v / span * 127.0), -127, 127).astype(np.int8)
    return np.clip(np.rint((v / span + 1.0) * 127.5), 0, 255).astype(np.uint8)


def dequantize(stored: np.ndarray, form: str, dim: int) -> np.ndarray:
    """An approximation of the float rows back (for tests and for clients that want floats): int8 and
    uint8 in units of their range (the scale of a normalised row); binary as +-1 per component."""
    kind = vector_form(form)
    if kind.floating:
        return np.asarray(stored, dtype=np.float32)
    if kind.packed:
        packed = (stored.astype(np.int16) + 128).astype(np.uint8) if form == "binary" else stored
        bits = np.unpackbits(packed, axis=1)[:, :dim]
        return bits.astype(np.float32) * 2.0 - 1.0
    r = range_of(dim)
    if form == "int8":
        return stored.astype(np.float32) / 127.0 * r
    return (stored.astype(np.float32) / 127.5 - 1.0) * r
