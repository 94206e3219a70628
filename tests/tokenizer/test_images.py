"""The tokenizer's image preparation (services/tokenizer/images.py): files to pixels under its limits,
an error naming the row that fails, chunks that fit a message, rows counted as the tower's tokens."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from embedfleet.services.tokenizer.images import ImagePreparer
from embedfleet.shared.errors import ServiceError
from embedfleet.shared.images.decode import ImageLimits
from embedfleet.shared.model_dir.load import load_model_info
from tests.support.image_models import build_clip


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return load_model_info(str(build_clip(tmp_path_factory.mktemp("clip"))))


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), 7, np.uint8)).save(out, "PNG")
    return out.getvalue()


def test_a_text_model_has_no_preparer():
    assert ImagePreparer.for_model(load_model_info(None)) is None


def test_images_become_pixels_and_the_first_bad_one_is_named(clip):
    preparer = ImagePreparer.for_model(clip, ImageLimits(max_bytes=10_000, max_pixels=5_000))
    assert preparer is not None and preparer.tokens == 17
    pixels = preparer.prepare([_png(40, 40), _png(64, 20)])
    assert isinstance(pixels, np.ndarray) and pixels.shape == (2, 3, 32, 32) and pixels.dtype == np.uint8
    refused = preparer.prepare([_png(40, 40), _png(100, 100)])  # 10,000 pixels, over 5,000
    assert isinstance(refused, ServiceError) and refused.row == 1 and "5000" in refused.message.replace(",", "")
    broken = preparer.prepare([b"\x89PNG\r\n\x1a\n" + b"\0" * 30])
    assert isinstance(broken, ServiceError) and broken.row == 0


def test_chunks_fit_a_message_and_count_the_tower_s_tokens(clip):
    preparer = ImagePreparer.for_model(clip)
    assert preparer is not None
    pixels = np.zeros((10, 3, 32, 32), np.uint8)  # 3,072 bytes an image
    parts = list(preparer.chunks(pixels, max_payload=(16 << 10) + 3 * 3072 + 10, max_rows=256))
    assert [(start, len(part)) for start, part in parts] == [(0, 3), (3, 3), (6, 3), (9, 1)]
    assert [len(part) for _, part in preparer.chunks(pixels, max_payload=1 << 20, max_rows=4)] == [4, 4, 2]
    np.testing.assert_array_equal(preparer.cu_seqlens(3), [0, 17, 34, 51])
