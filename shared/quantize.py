"""Vector forms an index stores: float32, float16, int8, uint8, binary and ubinary.

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

# form -> (wire dtype name, numpy dtype of one stored element)
FORMS: dict[str, tuple[str, np.dtype]] = {
    "float32": ("f4", np.dtype("<f4")),
    "float16": ("f2", np.dtype("<f2")),
    "int8": ("i1", np.dtype("i1")),
    "uint8": ("u1", np.dtype("u1")),
    "binary": ("b1", np.dtype("i1")),
    "ubinary": ("ub1", np.dtype("u1")),
}
WIRE_FORMS = {wire: form for form, (wire, _) in FORMS.items()}
# what a request names the form by (the HTTP field ``embedding_type``, ``reindex --embedding-type``):
# Cohere's and Jina's names, where ``float`` is float32; the form names themselves are accepted too
EMBEDDING_TYPES: dict[str, str] = {"float": "float32", **{form: form for form in FORMS}}
CLIP_SIGMAS = 4.0  # components beyond this many times 1/sqrt(d) (times the row's norm) are clipped


def form_named(name: str) -> str:
    """The form an ``embedding_type`` names; ValueError for a name that is none."""
    if name not in EMBEDDING_TYPES:
        raise ValueError(f"unknown embedding type {name!r} (known: {', '.join(EMBEDDING_TYPES)})")
    return EMBEDDING_TYPES[name]


def range_of(dim: int) -> float:
    """r: an int8 / uint8 row spans [-r·|v|, r·|v|]."""
    return min(1.0, CLIP_SIGMAS / math.sqrt(dim))


def stored_width(form: str, dim: int) -> int:
    """Elements stored per row of ``dim`` components (bytes, except float16/float32)."""
    if form not in FORMS:
        raise ValueError(f"unknown vector form {form!r} (known: {', '.join(FORMS)})")
    return -(-dim // 8) if form in ("binary", "ubinary") else dim


def row_bytes(form: str, dim: int) -> int:
    return stored_width(form, dim) * FORMS[form][1].itemsize


def quantize(vectors: np.ndarray, form: str) -> np.ndarray:
    """[n, d] float -> [n, stored_width(form, d)] of the form's element type."""
    if form not in FORMS:
        raise ValueError(f"unknown vector form {form!r} (known: {', '.join(FORMS)})")
    v = np.asarray(vectors, dtype=np.float32)
    if v.ndim != 2:
        raise ValueError("vectors must be a 2-D array")
    if form in ("float32", "float16"):
        return v.astype(FORMS[form][1], copy=False)
    if form in ("binary", "ubinary"):
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
    if form in ("float32", "float16"):
        return np.asarray(stored, dtype=np.float32)
    if form in ("binary", "ubinary"):
        packed = (stored.astype(np.int16) + 128).astype(np.uint8) if form == "binary" else stored
        bits = np.unpackbits(packed, axis=1)[:, :dim]
        return bits.astype(np.float32) * 2.0 - 1.0
    r = range_of(dim)
    if form == "int8":
        return stored.astype(np.float32) / 127.0 * r
    return (stored.astype(np.float32) / 127.5 - 1.0) * r
