"""The vector forms: one declaration of each form a vector is made, sent and stored in.

A form has one name inside embedfleet (``float32``, ``float16``, ``int8``, ``uint8``, ``binary``,
``ubinary``), the name job state, sinks, function arguments, the CLI and the docs use; one code on the
wire (``EmbedOptions.dtype`` and the results' ``dt``: ``f4`` ``f2`` ``i1`` ``u1`` ``b1`` ``ub1``, the
protocol's short names, which the services of one fleet must agree on: docs/protocol.md); the numpy
dtype of one stored element; and its bits per component, 1 for the bit-packed forms (8 components a
byte, the first in the highest bit). How float rows are made into each form: shared/vectors/quantize.py.

The HTTP APIs name forms in their own words, tabled once at the end of this module and read or
written at the edges only: ``embedding_type`` (Jina's names, where ``float`` is float32),
Cohere's ``embedding_types`` (``base64``: float32's bytes, base64-encoded) and the
``x-embedding-dtype`` header of an octet-stream answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class VectorForm:
    name: str  # the one name inside embedfleet
    wire: str  # its code in the protocol's messages
    dtype: np.dtype  # one stored element, little-endian
    bits: int  # per component: 32, 16, 8, or 1 (packed 8 to a byte)

    @property
    def packed(self) -> bool:
        return self.bits == 1

    @property
    def floating(self) -> bool:
        """Whether the components are stored as they are (float32, float16): a sparse vector's values
        and the vectors a search compares by cosine are."""
        return self.dtype.kind == "f"

    def width(self, dim: int) -> int:
        """Stored elements per row of ``dim`` components: ``dim``, or ceil(dim / 8) when packed."""
        return -(-dim // 8) if self.packed else dim

    def row_bytes(self, dim: int) -> int:
        return self.width(dim) * self.dtype.itemsize


FLOAT32 = VectorForm("float32", "f4", np.dtype("<f4"), 32)
FLOAT16 = VectorForm("float16", "f2", np.dtype("<f2"), 16)
INT8 = VectorForm("int8", "i1", np.dtype("i1"), 8)  # -127..127
UINT8 = VectorForm("uint8", "u1", np.dtype("u1"), 8)  # 0..255
BINARY = VectorForm("binary", "b1", np.dtype("i1"), 1)  # the packed bytes shifted by -128 into int8
UBINARY = VectorForm("ubinary", "ub1", np.dtype("u1"), 1)  # the packed bytes as they are

FORMS: dict[str, VectorForm] = {form.name: form for form in (FLOAT32, FLOAT16, INT8, UINT8, BINARY, UBINARY)}
WIRE_FORMS: dict[str, VectorForm] = {form.wire: form for form in FORMS.values()}


def vector_form(name: str) -> VectorForm:
    """The form of that name; ValueError for a name that is none."""
    form = FORMS.get(name)
    if form is None:
        raise ValueError(f"unknown vector form {name!r} (known: {', '.join(FORMS)})")
    return form


# -- the APIs' names for the forms ---------------------------------------------------------------

# ``embedding_type`` (an extension of the OpenAI, TEI and jobs routes; ``reindex --embedding-type``):
# Jina's and Cohere's names, where ``float`` is float32; every form's own name is accepted too
EMBEDDING_TYPES: dict[str, VectorForm] = {"float": FLOAT32, **FORMS}
# Cohere's ``embedding_types``: ``base64`` is each float32 row's bytes, base64-encoded
COHERE_TYPES: dict[str, VectorForm] = {
    "float": FLOAT32,
    "int8": INT8,
    "uint8": UINT8,
    "binary": BINARY,
    "ubinary": UBINARY,
    "base64": FLOAT32,
}
# the ``x-embedding-dtype`` header of an octet-stream answer, by form: what one row's bytes are
OCTET_DTYPES: dict[str, str] = {
    "float32": "float32-le",
    "float16": "float16-le",
    "int8": "int8",
    "uint8": "uint8",
    "binary": "binary",
    "ubinary": "ubinary",
}


def form_named(name: str) -> VectorForm:
    """The form an ``embedding_type`` names; ValueError for a name that is none."""
    form = EMBEDDING_TYPES.get(name)
    if form is None:
        raise ValueError(f"unknown embedding type {name!r} (known: {', '.join(EMBEDDING_TYPES)})")
    return form
