"""``PageProcessing`` against transformers' Qwen2-VL image processor on the same PIL images: pixel rows
equal bit for bit (stricter than the 1e-5 tolerance of the CLIP tests) and the same patch grid, for images
of many sizes (under min_pixels, over max_pixels, odd, narrow) and every mode a decoded PNG, JPEG or GIF
comes in; configs read as transformers reads them (``size`` against top-level min_pixels / max_pixels);
the worker's torch ``PagePixels`` equal to the numpy rows; ``ColQwen2Processor``'s grids and image tokens.

The reference is ``Qwen2VLImageProcessorPil``: what ``Qwen2VLImageProcessor`` resolves to without
torchvision (this environment), named directly so that installing torchvision cannot swap in its backend,
whose resize differs from Pillow's. Configs keep min/max pixels small so that images stay small.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from transformers import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.images.decode import ImageError
from embedfleet.shared.images.pages import PageProcessing
from embedfleet.shared.images.preprocess import MAX_RESIZED_PIXELS
from tests.shared.images.test_preprocess import MODES, _noise

SMALL = dict(min_pixels=100, max_pixels=64 * 28 * 28)  # at most about 64 patches of 28 x 28
# (name, Qwen2VLImageProcessorPil's keyword arguments)
PROCESSORS = [
    ("defaults", {}),
    ("small", SMALL),
    # Qwen3-VL's shape of processor: 16-pixel patches, mean and std 0.5; and another filter
    (
        "patch16-bilinear",
        dict(min_pixels=300, max_pixels=40 * 32 * 32, patch_size=16, resample=2, image_mean=0.5, image_std=0.5),
    ),
    (
        "patch8-merge3-t1",
        dict(min_pixels=50, max_pixels=30 * 24 * 24, patch_size=8, merge_size=3, temporal_patch_size=1),
    ),
    ("no-rescale", dict(SMALL, do_rescale=False)),
    ("no-normalize", dict(SMALL, do_normalize=False)),
]
# (width, height): odd, under min_pixels, over max_pixels (SMALL's), one pixel, aspect ratios 200 and 1/150
SIZES = [(301, 177), (20, 30), (900, 700), (1, 1), (200, 1), (1, 150), (57, 29)]


@pytest.fixture(scope="module", params=PROCESSORS, ids=[p[0] for p in PROCESSORS])
def pair(request, tmp_path_factory) -> tuple[Qwen2VLImageProcessorPil, PageProcessing]:
    """(transformers' processor, ours from the folder it saved)."""
    name, kwargs = request.param
    reference = Qwen2VLImageProcessorPil(**kwargs)
    folder = tmp_path_factory.mktemp(name)
    reference.save_pretrained(folder)
    return reference, PageProcessing.from_folder(folder)


def _assert_same(reference: Qwen2VLImageProcessorPil, ours: PageProcessing, *images: Image.Image) -> None:
    """Every image's rows and grid equal to transformers' (the images in one call: rows concatenated)."""
    theirs = reference(images=list(images), return_tensors="np")
    prepared = [ours.prepare(image) for image in images]
    p, t = ours.patch_size, ours.temporal_patch_size
    for rows, (gh, gw) in prepared:
        assert rows.dtype == np.uint8 and rows.shape == (gh * gw, 3 * p * p)
    assert theirs["image_grid_thw"].tolist() == [[1, gh, gw] for _, (gh, gw) in prepared]
    mine = np.concatenate([ours.pixel_values(rows) for rows, _ in prepared])
    assert mine.dtype == np.float32 and mine.shape == theirs["pixel_values"].shape
    assert mine.shape[1] == 3 * t * p * p
    assert np.array_equal(mine, theirs["pixel_values"])  # bit for bit, not only within 1e-5


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_random_rgb_images_of_many_sizes(pair, size):
    _assert_same(*pair, Image.fromarray(_noise(*size, 3), "RGB"))


@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_of_a_decoded_image(pair, mode):
    """RGBA and palettes with transparency (composited onto white), L, LA, CMYK JPEG, I;16 PNG, 1-bit..."""
    _assert_same(*pair, MODES[mode])


def test_a_batch_of_pages_concatenates_their_rows(pair):
    images = [Image.fromarray(_noise(w, h, 3), "RGB") for w, h in SIZES[:4]]
    _assert_same(*pair, *images, MODES["P-gif-transparent"])


def test_grids_and_sizes_as_the_image_shows_them():
    ours = PageProcessing.from_config(Qwen2VLImageProcessorPil(**SMALL).to_dict())
    rows, grid = ours.prepare(Image.fromarray(_noise(301, 177, 3), "RGB"))
    assert ours.target_size(177, 301) == (12 * 14, 20 * 14)  # (height, width): 168 x 280 < 64 * 28 * 28
    assert grid == (12, 20) and rows.shape == (240, 588)
    assert ours.tokens_per_image(*grid) == 60
    assert ours.target_size(30, 20) == (28, 28)  # each side rounded to a multiple of 28
    assert PageProcessing().target_size(30, 20) == (84, 56)  # 28 x 28 under the default min_pixels: scaled up
    assert PageProcessing().target_size(700, 900) == (700, 896)  # defaults: rounded to multiples of 28


def test_the_patch_order_is_merge_windows_then_channels():
    """Patch (row 1, col 2) of a 4 x 4 grid is in window (0, 1) at (1, 0): row 1 * 4 + 2 = 6 of 16; each
    row is one channel's p x p after another."""
    ours = PageProcessing(min_pixels=56 * 56, max_pixels=56 * 56)
    image = np.zeros((56, 56, 3), dtype=np.uint8)
    image[14:28, 28:42] = (10, 20, 30)  # patch (1, 2)
    rows, grid = ours.prepare(Image.fromarray(image, "RGB"))
    assert grid == (4, 4)
    assert [int(i) for i in np.flatnonzero(rows.any(axis=1))] == [6]
    assert (rows[6].reshape(3, 196) == np.array([[10], [20], [30]])).all()


@pytest.mark.parametrize(
    "kwargs", [{}, SMALL, dict(min_pixels=1, max_pixels=28 * 28), dict(min_pixels=10**6, max_pixels=2 * 10**6)]
)
def test_target_sizes_are_smart_resize(kwargs):
    """Many image sizes, no pixels: the sizes transformers' smart_resize gives (factor 28)."""
    ours = PageProcessing(**kwargs)
    rng = np.random.default_rng(1)
    sides = [*rng.integers(1, 5000, (300, 2)).tolist(), [1, 200], [200, 1], [14, 14], [42, 70], [4999, 25]]
    for height, width in sides:
        if max(height, width) / min(height, width) > 200:
            continue
        expected = smart_resize(height, width, 28, ours.min_pixels, ours.max_pixels)
        assert ours.target_size(height, width) == expected, (height, width)


@pytest.mark.parametrize(
    "kwargs",
    [{}, SMALL, dict(min_pixels=1, max_pixels=28 * 28), dict(min_pixels=50_000, max_pixels=50_000), PROCESSORS[3][1]],
)
def test_max_patches_bounds_every_grid(kwargs):
    """No image the processor takes has more patches than ``max_patches``, long narrow ones included (which
    pass max_pixels: a side kept at one factor)."""
    ours = PageProcessing(**kwargs)
    rng = np.random.default_rng(2)
    most = 0
    for short in [*range(1, 120), *rng.integers(120, 20_000, 100).tolist()]:
        for ratio in [1, 2, 3.7, 10, 50, 150, 199.9, 200, *rng.uniform(1, 200, 5).tolist()]:
            long = int(short * ratio)
            for height, width in ((short, long), (long, short)):
                gh, gw = (side // ours.patch_size for side in ours.target_size(height, width))
                most = max(most, gh * gw)
    assert most <= ours.max_patches
    assert ours.row_bytes == 3 * ours.patch_size**2


def test_a_long_narrow_image_passes_max_pixels():
    ours = PageProcessing(**SMALL)
    assert ours.target_size(15, 2995) == (28, 3164)  # 88592 pixels > max_pixels 50176
    assert (28 // 14) * (3164 // 14) == 452 == ours.max_patches > ours.max_pixels // 14**2 == 256


@pytest.mark.parametrize("size", [(201, 1), (1, 300), (10_000, 49)], ids=["201x1", "1x300", "10000x49"])
def test_an_aspect_ratio_over_200_is_refused_as_transformers_refuses_it(size):
    image = Image.fromarray(_noise(*size, 3), "RGB")
    with pytest.raises(ValueError, match="absolute aspect ratio must be smaller than 200"):
        Qwen2VLImageProcessorPil(**SMALL)(images=image, return_tensors="np")
    with pytest.raises(ImageError) as refused:
        PageProcessing(**SMALL).prepare(image)
    ratio = max(size) / min(size)
    assert str(refused.value) == (
        f"the image is {size[0]}x{size[1]} pixels: its aspect ratio {ratio:.1f} is over 200, the most this model takes"
    )


def test_a_resize_past_the_sanity_cap_is_refused():
    ours = PageProcessing(max_pixels=10**9)
    assert ours.target_size(5000, 5000) == (5012, 5012)
    with pytest.raises(ImageError, match=f"would resize it to 7000x7000, more than {MAX_RESIZED_PIXELS} pixels"):
        ours.target_size(7000, 7000)
    with pytest.raises(ImageError, match="it has no pixels"):
        ours.target_size(0, 5)


def test_rgb_only_when_the_processor_does_not_convert():
    reference = Qwen2VLImageProcessorPil(do_convert_rgb=False, **SMALL)
    ours = PageProcessing.from_config(reference.to_dict())
    _assert_same(reference, ours, Image.fromarray(_noise(50, 40, 3), "RGB"))
    with pytest.raises(ImageError) as refused:
        ours.prepare(MODES["L"])
    assert str(refused.value) == "this model takes RGB images only (its processor's do_convert_rgb is off), not mode L"


def test_the_devices_pixels_equal_the_hosts_bit_for_bit():
    """``PagePixels`` on CPU against ``pixel_values``: every byte value of every channel, and real rows."""
    torch = pytest.importorskip("torch")
    from embedfleet.services.gpu_worker.engine.page_pixels import PagePixels

    for name, kwargs in PROCESSORS:
        ours = PageProcessing.from_config(Qwen2VLImageProcessorPil(**kwargs).to_dict())
        width = 3 * ours.patch_size**2
        every = (np.arange(4 * width) % 256).astype(np.uint8).reshape(4, width)  # each value in each channel
        real, _ = ours.prepare(MODES["RGBA"])
        pixels = PagePixels(ours, torch.device("cpu"))
        for rows in (every, real, every[:0]):
            host = ours.pixel_values(rows)
            device = pixels(torch.from_numpy(rows))
            assert device.dtype == torch.float32 and device.shape == host.shape, name
            assert np.array_equal(device.numpy(), host), name
    with pytest.raises(ValueError, match=r"rows must be uint8 \[P, 588\]"):
        pixels(torch.zeros(2, 588, dtype=torch.float32))


def test_colqwen2_processor_grids_and_image_tokens():
    """ColQwen2Processor (a word-level tokenizer of Qwen2-VL's special tokens stands in for Qwen2's):
    its grids are ours, and each page's prompt holds ``tokens_per_image`` image tokens."""
    pytest.importorskip("torch")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import ColQwen2Processor, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
    vocab = {token: i for i, token in enumerate([*specials, "[UNK]", "user", "Describe", "the", "image", "."])}
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="<|endoftext|>", unk_token="[UNK]", additional_special_tokens=specials
    )
    image_processor = Qwen2VLImageProcessorPil(**SMALL)
    processor = ColQwen2Processor(image_processor=image_processor, tokenizer=tokenizer)
    ours = PageProcessing.from_config(image_processor.to_dict())
    images = [Image.fromarray(_noise(w, h, 3), "RGB") for w, h in [(301, 177), (20, 30), (900, 700)]]
    out = processor(images=images)
    grids = [ours.prepare(image)[1] for image in images]
    assert out["image_grid_thw"].tolist() == [[1, gh, gw] for gh, gw in grids]
    image_tokens = (out["input_ids"] == vocab["<|image_pad|>"]).sum(dim=1).tolist()
    assert image_tokens == [ours.tokens_per_image(gh, gw) for gh, gw in grids] == [60, 1, 63]


def _write(folder: Path, config: Any, name: str = "preprocessor_config.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(config))
    return folder


QWEN = {"image_processor_type": "Qwen2VLImageProcessor"}


@pytest.mark.parametrize(
    ("config", "bounds"),
    [
        ({**QWEN, "size": {"shortest_edge": 200, "longest_edge": 30_000}}, (200, 30_000)),  # new configs
        ({**QWEN, "min_pixels": 300, "max_pixels": 20_000}, (300, 20_000)),  # old ones
        # both: the top-level keys win, key by key (colqwen2-v1.0 writes size in min/max_pixels keys too)
        ({**QWEN, "min_pixels": 300, "max_pixels": 20_000, "size": {"min_pixels": 1, "max_pixels": 9}}, (300, 20_000)),
        ({**QWEN, "max_pixels": 20_000, "size": {"shortest_edge": 500, "longest_edge": 9}}, (500, 20_000)),
        ({**QWEN, "min_pixels": None, "max_pixels": 20_000}, (3136, 20_000)),  # null: size's (the class's)
        ({**QWEN, "size": None, "max_pixels": 50_000}, (3136, 50_000)),
        ({"image_processor_type": "Qwen2VLImageProcessorFast", "max_pixels": 10_000, "resample": 1}, (3136, 10_000)),
        (
            {"image_processor_type": "Qwen2VLImageProcessorPil", "max_pixels": 10_000, "do_rescale": None},
            (3136, 10_000),
        ),
        ({**QWEN, "max_pixels": 10_000, "do_normalize": False, "image_mean": None}, (3136, 10_000)),
        (
            {**QWEN, "max_pixels": 10_000, "do_convert_rgb": None, "processor_class": "ColQwen2Processor"},
            (3136, 10_000),
        ),
    ],
)
def test_configs_as_transformers_reads_them(tmp_path, config, bounds):
    folder = _write(tmp_path / "model", config)
    reference, ours = Qwen2VLImageProcessorPil.from_pretrained(str(folder)), PageProcessing.from_folder(folder)
    assert (reference.size.shortest_edge, reference.size.longest_edge) == (ours.min_pixels, ours.max_pixels) == bounds
    rgb = [Image.fromarray(_noise(*size, 3), "RGB") for size in [(301, 177), (20, 30), (900, 700)]]
    _assert_same(reference, ours, *rgb)
    if ours.do_convert_rgb:
        _assert_same(reference, ours, MODES["P-alpha"])


def test_the_class_defaults():
    ours = PageProcessing.from_config(QWEN)
    assert ours == PageProcessing()
    reference = Qwen2VLImageProcessorPil()
    assert (ours.patch_size, ours.temporal_patch_size, ours.merge_size) == (14, 2, 2)
    assert (ours.min_pixels, ours.max_pixels) == (reference.size.shortest_edge, reference.size.longest_edge)
    assert (ours.resample, ours.rescale_factor, ours.image_mean, ours.image_std) == (
        reference.resample,
        reference.rescale_factor,
        tuple(reference.image_mean),
        tuple(reference.image_std),
    )
    assert type(PageProcessing.from_config(reference.to_dict()).resample) is int  # not PILImageResampling


def test_processor_config_json_is_read_first(tmp_path):
    folder = _write(tmp_path / "model", {**QWEN, "max_pixels": 90_000})
    _write(folder, {"image_processor": {**QWEN, "max_pixels": 20_000}}, "processor_config.json")
    reference = Qwen2VLImageProcessorPil.from_pretrained(str(folder))
    assert PageProcessing.from_folder(folder).max_pixels == reference.size.longest_edge == 20_000


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"image_processor_type": "CLIPImageProcessor"},
            "image_processor_type 'CLIPImageProcessor' is not a page model's",
        ),
        ({}, "names no image_processor_type (a page model's is Qwen2VLImageProcessor)"),
        ({**QWEN, "auto_map": {"AutoImageProcessor": "x.Y"}}, "auto_map names a custom image processor (x.Y)"),
        # transformers fails at the first image on each of these
        ({**QWEN, "size": {"min_pixels": 100, "max_pixels": 900}}, "needs exactly shortest_edge and longest_edge"),
        ({**QWEN, "size": {"shortest_edge": 100}}, "size {'shortest_edge': 100} (top-level"),
        ({**QWEN, "size": 300}, "size 300 is not a dict of shortest_edge and longest_edge"),
        (
            {**QWEN, "min_pixels": 0},
            "min and max pixels {'shortest_edge': 0, 'longest_edge': 1003520} must be positive",
        ),
        ({**QWEN, "max_pixels": 1e6}, "must be positive integers"),
        ({**QWEN, "patch_size": None}, "patch_size must be a positive integer, got None"),
        ({**QWEN, "merge_size": 0}, "merge_size must be a positive integer, got 0"),
        ({**QWEN, "temporal_patch_size": "2"}, "temporal_patch_size must be a positive integer, got '2'"),
        ({**QWEN, "resample": None}, "resample None is not one of PIL's filter codes 0-5"),
        ({**QWEN, "do_resize": False}, "do_resize off (each image patched at its own size"),
        ({**QWEN, "rescale_factor": None}, "rescale_factor is None, not a positive number"),
        ({**QWEN, "image_mean": [0.5, 0.5]}, "image_mean is [0.5, 0.5], not a number or 3 numbers"),
        ({**QWEN, "image_std": [1, 0, 1]}, "image_std [1, 0, 1] has a 0"),
        ({**QWEN, "do_normalize": "yes"}, "do_normalize must be true, false or null, got 'yes'"),
    ],
)
def test_refused_configs_name_the_option(config, message):
    with pytest.raises(ConfigError) as refused:
        PageProcessing.from_config(config, where="cfg.json")
    assert str(refused.value).startswith("cfg.json")
    assert message in str(refused.value)


def test_a_folder_without_a_preprocessor_config_is_refused(tmp_path):
    with pytest.raises(ConfigError) as refused:
        PageProcessing.from_folder(tmp_path)
    assert (
        str(refused.value) == f"{tmp_path} has no preprocessor_config.json: an image model needs its image processor's"
    )
    _write(tmp_path, [1, 2])
    with pytest.raises(ConfigError, match=r"preprocessor_config\.json is not a JSON object"):
        PageProcessing.from_folder(tmp_path)
