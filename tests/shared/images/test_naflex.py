"""SigLIP 2's NaFlex processor as shared/images/naflex.py applies it against transformers'
Siglip2ImageProcessorPil: the target size of every shape (its binary search), and the patch rows, bit for
bit, over many sizes, modes and patch bounds; its config read with the class's defaults, bad values refused."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.images.decode import ImageError
from embedfleet.shared.images.naflex import NaFlexProcessing

SIZES = [(640, 480), (100, 3000), (17, 5), (224, 224), (1, 1), (333, 777), (3000, 2), (16, 16), (1024, 768)]


@pytest.mark.parametrize("bound", [16, 256, 1024])
def test_target_sizes_are_transformers_binary_search(bound):
    from transformers.models.siglip2.image_processing_pil_siglip2 import get_image_size_for_max_num_patches

    processing = NaFlexProcessing(max_num_patches=bound)
    rng = np.random.default_rng(bound)
    shapes = SIZES + [tuple(int(v) for v in rng.integers(1, 4000, 2)) for _ in range(40)]
    for width, height in shapes:
        ours = processing.target_size(height, width)
        assert ours == get_image_size_for_max_num_patches(height, width, 16, bound), (width, height)
        assert ours[0] % 16 == ours[1] % 16 == 0 and ours[0] * ours[1] <= bound * 256


@pytest.mark.parametrize("bound", [16, 256, 1024])
def test_patch_rows_are_the_processors_pixel_values_bit_for_bit(bound):
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    theirs = Siglip2ImageProcessorPil(max_num_patches=bound)
    ours = NaFlexProcessing(max_num_patches=bound)
    rng = np.random.default_rng(0)
    for width, height in SIZES[:6]:
        image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        rows, (gh, gw) = ours.prepare(image)
        made = theirs(image, return_tensors="np")
        assert tuple(made["spatial_shapes"][0]) == (gh, gw)
        assert rows.dtype == np.uint8 and rows.shape == (gh * gw, ours.row_bytes)
        assert np.array_equal(ours.pixel_values(rows), made["pixel_values"][0][: gh * gw]), (width, height)
        assert made["pixel_attention_mask"][0].sum() == gh * gw


def test_a_grayscale_or_transparent_image_is_converted_and_an_rgb_only_config_refuses_it():
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    gray = Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 60), dtype=np.uint8), "L")
    rows, (gh, gw) = NaFlexProcessing().prepare(gray)
    made = Siglip2ImageProcessorPil()(gray.convert("RGB"), return_tensors="np")
    assert np.array_equal(NaFlexProcessing().pixel_values(rows), made["pixel_values"][0][: gh * gw])
    with pytest.raises(ImageError, match="RGB images only"):
        NaFlexProcessing.from_config({"do_convert_rgb": False}).prepare(gray)


def test_the_config_takes_the_class_defaults_and_refuses_bad_values():
    cfg = NaFlexProcessing.from_config({"image_processor_type": "Siglip2ImageProcessor", "max_num_patches": 512})
    assert (cfg.patch_size, cfg.max_num_patches, cfg.resample, cfg.image_mean) == (16, 512, 2, (0.5, 0.5, 0.5))
    for bad, says in [
        ({"image_processor_type": "SiglipImageProcessor"}, "not SigLIP 2's NaFlex processor"),
        ({"max_num_patches": 0}, "max_num_patches must be a positive integer"),
        ({"max_num_patches": 100_000}, "is over 4096"),
        ({"resample": 9}, "not one of PIL's filter codes"),
        ({"image_std": [0.5, 0, 0.5]}, "image_std"),
    ]:
        with pytest.raises(ConfigError, match=says):
            NaFlexProcessing.from_config(bad)
    with pytest.raises(ImageError, match="no pixels"):
        NaFlexProcessing().target_size(0, 5)
