"""Quantized vector forms on real vectors (the real model over real text, sentence-transformers as the
reference for the bit-packed forms)."""

import numpy as np
import pytest

from embedfleet.shared.vectors.forms import FORMS, vector_form
from embedfleet.shared.vectors.quantize import dequantize, quantize, range_of
from tests.conftest import cosines
from tests.support.corpus import mixed_texts

INT8_COSINE = 0.99  # an int8 / uint8 row against its float row


@pytest.fixture(scope="module")
def vectors(reference) -> np.ndarray:
    return reference.encode(mixed_texts(120), convert_to_numpy=True, normalize_embeddings=True)


def test_bytes_per_vector_of_each_form():
    assert {name: form.row_bytes(384) for name, form in FORMS.items()} == {
        "float32": 1536,
        "float16": 768,
        "int8": 384,
        "uint8": 384,
        "binary": 48,
        "ubinary": 48,
    }
    assert vector_form("binary").width(385) == 49  # the last byte carries one bit
    with pytest.raises(ValueError, match="unknown vector form 'int4'"):
        vector_form("int4")


@pytest.mark.parametrize("form", ["int8", "uint8"])
def test_int8_and_uint8_keep_the_direction_of_real_vectors(vectors, form):
    stored = quantize(vectors, form)
    assert stored.dtype == FORMS[form].dtype and stored.shape == vectors.shape
    assert cosines(dequantize(stored, form, vectors.shape[1]), vectors).min() >= INT8_COSINE
    # the range is used: real components reach well into the 8 bits, few are clipped
    centred = stored.astype(np.int16) - (0 if form == "int8" else 128)
    assert np.abs(centred).max() >= 100
    assert (np.abs(centred) >= 127).mean() < 0.001


def test_int8_uses_one_scale_for_normalised_rows(vectors):
    """Dot products of int8 rows rank the documents as the float ones do."""
    stored = quantize(vectors, "int8").astype(np.float64)
    query, docs = 0, np.arange(1, len(vectors))
    float_order = np.argsort(-(vectors[docs] @ vectors[query]))[:10]
    int8_order = np.argsort(-(stored[docs] @ stored[query]))[:10]
    assert len(set(float_order) & set(int8_order)) >= 8
    # a row and the same row scaled are the same int8 row only when unnormalised rows use their norm
    assert np.array_equal(quantize(vectors[:4] * 3.0, "int8"), quantize(vectors[:4], "int8"))
    assert range_of(384) == pytest.approx(4 / np.sqrt(384))


@pytest.mark.parametrize("form", ["binary", "ubinary"])
def test_each_bit_is_the_sign_of_its_component(vectors, form):
    stored = quantize(vectors, form)
    assert stored.shape == (len(vectors), 48)
    packed = stored.view(np.uint8) ^ (0x80 if form == "binary" else 0)  # binary: bytes shifted by -128
    bits = np.unpackbits(packed, axis=1)
    assert np.array_equal(bits.astype(bool), vectors > 0)
    assert np.array_equal(dequantize(stored, form, 384), np.where(vectors > 0, 1.0, -1.0))


@pytest.mark.parametrize("form", ["binary", "ubinary"])
def test_bit_packed_forms_equal_sentence_transformers(vectors, form):
    from sentence_transformers.util.quantization import quantize_embeddings

    want = quantize_embeddings(vectors, precision=form)
    got = quantize(vectors, form)
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_float_forms_are_the_components():
    v = np.array([[0.5, -0.25, 0.125]], dtype=np.float32)
    assert quantize(v, "float32").tobytes() == v.astype("<f4").tobytes()
    assert quantize(v, "float16").dtype == np.dtype("<f2")
    assert np.array_equal(quantize(np.zeros((1, 8), np.float32), "int8"), np.zeros((1, 8), np.int8))  # no NaN
