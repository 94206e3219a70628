"""``ImageProcessing`` against transformers' own processors on the same PIL images: pixel tensors equal
(max abs difference <= 1e-5, in practice 0) for images of many sizes and every mode a decoded PNG, JPEG or
GIF comes in, for CLIP's and SigLIP's processors as their defaults and as configured otherwise, loaded
from the folder transformers saves; the configs it cannot reproduce refused by name.

The references are ``CLIPImageProcessorPil`` / ``SiglipImageProcessorPil``: what ``CLIPImageProcessor``
and ``SiglipImageProcessor`` resolve to without torchvision (this environment), named directly so that
installing torchvision cannot swap in its backend, whose resize differs from Pillow's.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from transformers import CLIPImageProcessorPil, SiglipImageProcessorPil

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.images.decode import ImageError, ImageLimits, open_image
from embedfleet.shared.images.preprocess import MAX_RESIZED_PIXELS, ImageProcessing

TOLERANCE = 1e-5
SIZES = [(1, 1), (3, 500), (500, 3), (224, 224), (225, 223), (640, 480), (1000, 37)]  # (width, height)
# (name, transformers class, its keyword arguments)
PROCESSORS = [
    ("clip-defaults", CLIPImageProcessorPil, {}),
    ("clip-64-56", CLIPImageProcessorPil, dict(size={"shortest_edge": 64}, crop_size={"height": 56, "width": 56})),
    # the crop larger than the resized image (and not square): zero padding on the short side
    (
        "clip-crop-larger",
        CLIPImageProcessorPil,
        dict(size={"shortest_edge": 40}, crop_size={"height": 64, "width": 50}),
    ),
    ("siglip-defaults", SiglipImageProcessorPil, {}),
    ("siglip-32x48-bilinear", SiglipImageProcessorPil, dict(size={"height": 32, "width": 48}, resample=2)),
]


@pytest.fixture(scope="module", params=PROCESSORS, ids=[p[0] for p in PROCESSORS])
def pair(request, tmp_path_factory) -> tuple[Any, ImageProcessing]:
    """(transformers' processor, ours from the folder it saved)."""
    name, cls, kwargs = request.param
    reference = cls(**kwargs)
    folder = tmp_path_factory.mktemp(name)
    reference.save_pretrained(folder)
    return reference, ImageProcessing.from_folder(folder)


def _noise(width: int, height: int, channels: int, seed: int = 0) -> np.ndarray:
    shape = (height, width) if channels == 1 else (height, width, channels)
    return np.random.default_rng(seed + width * 7919 + height).integers(0, 256, shape, dtype=np.uint8)


def _assert_same(reference: Any, ours: ImageProcessing, image: Image.Image) -> None:
    theirs = reference(images=image, return_tensors="np")["pixel_values"]  # [1, 3, H, W] float32
    pixels = ours.pixels(image)
    assert pixels.dtype == np.uint8 and pixels.shape == (3, *ours.output_size)
    mine = ours.normalize(pixels)
    assert mine.dtype == np.float32 and mine.shape == theirs.shape[1:]
    assert np.abs(mine - theirs[0]).max() <= TOLERANCE


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_random_rgb_images_of_many_sizes(pair, size):
    _assert_same(*pair, Image.fromarray(_noise(*size, 3), "RGB"))


def _reloaded(image: Image.Image, fmt: str, **save: Any) -> Image.Image:
    """``image`` through a file of ``fmt`` and back, opened as a client's image is."""
    buffer = io.BytesIO()
    image.save(buffer, fmt, **save)
    return open_image(buffer.getvalue(), ImageLimits())


def _palette(width: int, height: int) -> Image.Image:
    image = Image.fromarray(_noise(width, height, 1) % 16, "P")
    image.putpalette(_noise(16, 1, 3, seed=1).tobytes())
    return image


def _modes() -> dict[str, Image.Image]:
    w, h = 97, 61
    alpha = _noise(w, h, 4)
    alpha[..., 3] = np.where(alpha[..., 3] < 64, 0, alpha[..., 3])  # some fully transparent pixels
    sixteen = (_noise(w, h, 1).astype(np.uint16) * 257) // np.uint16(1 + (np.arange(w) % 300))  # 0..65535
    return {
        "RGBA": _reloaded(Image.fromarray(alpha, "RGBA"), "PNG"),
        "LA": _reloaded(Image.fromarray(_noise(w, h, 4)[..., :2].copy(), "LA"), "PNG"),
        "L": _reloaded(Image.fromarray(_noise(w, h, 1), "L"), "PNG"),
        "P": _reloaded(_palette(w, h), "PNG"),
        # palette entries with their own alpha (tRNS as bytes), and one transparent index (GIF)
        "P-alpha": _reloaded(_palette(w, h), "PNG", transparency=bytes(range(0, 256, 16))),
        "P-gif-transparent": _reloaded(_palette(w, h), "GIF", transparency=3),
        "RGB-tRNS": _reloaded(Image.fromarray(_noise(w, h, 3) // 128 * 255, "RGB"), "PNG", transparency=(0, 255, 0)),
        "CMYK-jpeg": _reloaded(Image.fromarray(_noise(w, h, 4), "CMYK"), "JPEG", quality=90),
        "I;16-png": _reloaded(Image.fromarray(sixteen), "PNG"),
        "1-bit": _reloaded(Image.fromarray(_noise(w, h, 1) > 127), "PNG"),
        "RGB-jpeg": _reloaded(Image.fromarray(_noise(w, h, 3), "RGB"), "JPEG"),
        "RGB-webp": _reloaded(Image.fromarray(_noise(w, h, 3), "RGB"), "WEBP", lossless=True),
    }


MODES = _modes()
EXPECTED_MODES = {
    "RGBA": "RGBA",
    "LA": "LA",
    "L": "L",
    "P": "P",
    "P-alpha": "P",
    "P-gif-transparent": "P",
    "RGB-tRNS": "RGB",
    "CMYK-jpeg": "CMYK",
    "I;16-png": "I;16",
    "1-bit": "1",
    "RGB-jpeg": "RGB",
    "RGB-webp": "RGB",
}


def test_the_modes_are_what_their_names_say():
    assert {name: image.mode for name, image in MODES.items()} == EXPECTED_MODES
    assert MODES["P-alpha"].info["transparency"] == bytes(range(0, 256, 16))
    assert MODES["P-gif-transparent"].info["transparency"] == 3
    assert MODES["RGB-tRNS"].info["transparency"] == (0, 255, 0)


@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_of_a_decoded_image(pair, mode):
    _assert_same(*pair, MODES[mode])


def test_pixel_values_are_equal_bit_for_bit(pair):
    """Beyond the tolerance: the same bytes resampled, the same float32 arithmetic."""
    reference, ours = pair
    for image in (MODES["RGBA"], MODES["CMYK-jpeg"], Image.fromarray(_noise(225, 223, 3), "RGB")):
        theirs = reference(images=image, return_tensors="np")["pixel_values"][0]
        assert np.array_equal(ours.normalize(ours.pixels(image)), theirs)


def test_transparency_is_composited_onto_white():
    ours = ImageProcessing.from_dict({"image_processor_type": "SiglipImageProcessor", "size": [2, 2], "resample": 0})
    clear = Image.new("RGBA", (2, 2), (10, 20, 30, 0))
    assert (ours.pixels(clear) == 255).all()
    assert (ours.pixels(Image.new("RGBA", (2, 2), (10, 20, 30, 255))).transpose(1, 2, 0) == (10, 20, 30)).all()


def test_a_batch_normalises_as_transformers_batches():
    reference = CLIPImageProcessorPil(size={"shortest_edge": 48}, crop_size={"height": 40, "width": 40})
    ours = ImageProcessing.from_dict(reference.to_dict())
    images = [Image.fromarray(_noise(w, h, 3), "RGB") for w, h in SIZES[:5]]
    theirs = reference(images=images, return_tensors="np")["pixel_values"]  # [5, 3, 40, 40]
    mine = ours.normalize(np.stack([ours.pixels(image) for image in images]))
    assert mine.shape == theirs.shape == (5, 3, 40, 40)
    assert np.abs(mine - theirs).max() <= TOLERANCE


def _write(folder: Path, config: dict[str, Any], name: str = "preprocessor_config.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    "config",
    [
        {"image_processor_type": "CLIPImageProcessor"},  # every option the class's default
        {"image_processor_type": "SiglipImageProcessorFast", "resample": 2},
        # an old CLIP config: the feature extractor's name, int sizes (shortest edge; crop square)
        {"feature_extractor_type": "CLIPFeatureExtractor", "size": 80, "crop_size": 72, "do_center_crop": True},
        {"image_processor_type": "CLIPImageProcessor", "use_square_size": True, "size": 300},  # KOSMOS-2: 224x224
        {
            "image_processor_type": "CLIPImageProcessor",
            "size": {"shortest_edge": 60, "longest_edge": 90},
            "crop_size": 50,
        },
        {"image_processor_type": "CLIPImageProcessor", "do_resize": False, "crop_size": [30, 20], "image_mean": 0.4},
        {"image_processor_type": "CLIPImageProcessor", "do_rescale": False, "do_normalize": False},
        {"image_processor_type": "CLIPImageProcessor", "do_rescale": False, "rescale_factor": None},
        {
            "image_processor_type": "SiglipImageProcessor",
            "do_center_crop": True,
            "crop_size": {"height": 200, "width": 230},
        },
        {"image_processor_type": "SiglipImageProcessor", "image_mean": None, "do_normalize": False, "resample": 1},
        {"image_processor_type": "CLIPImageProcessor", "resample": 4, "size": [50, 70], "do_center_crop": None},
        {"image_processor_type": "CLIPImageProcessor", "resample": 5, "processor_class": "CLIPProcessor"},
    ],
)
def test_configs_as_transformers_reads_them(tmp_path, config):
    cls = SiglipImageProcessorPil if "Siglip" in str(config.get("image_processor_type")) else CLIPImageProcessorPil
    folder = _write(tmp_path / "model", config)
    reference, ours = cls.from_pretrained(str(folder)), ImageProcessing.from_folder(folder)
    for image in (Image.fromarray(_noise(*size, 3), "RGB") for size in [(1, 1), (225, 223), (1000, 37)]):
        _assert_same(reference, ours, image)
    _assert_same(reference, ours, MODES["P-alpha"])


def test_processor_config_json_is_read_first(tmp_path):
    folder = _write(tmp_path / "model", {"image_processor_type": "CLIPImageProcessor", "crop_size": 128})
    _write(
        folder,
        {"image_processor": {"image_processor_type": "CLIPImageProcessor", "crop_size": 32}},
        "processor_config.json",
    )
    reference = CLIPImageProcessorPil.from_pretrained(str(folder))
    assert (
        ImageProcessing.from_folder(folder).output_size
        == (reference.crop_size.height, reference.crop_size.width)
        == (32, 32)
    )


def test_config_json_model_type_names_the_class(tmp_path):
    folder = _write(tmp_path / "model", {"size": {"height": 64, "width": 32}})
    _write(folder, {"model_type": "siglip"}, "config.json")
    ours = ImageProcessing.from_folder(folder)
    assert (ours.processor, ours.output_size, ours.mean) == ("SiglipImageProcessor", (64, 32), (0.5, 0.5, 0.5))


def test_output_size_and_fields():
    clip = ImageProcessing.from_dict({"image_processor_type": "CLIPImageProcessorFast"})
    assert (clip.processor, clip.output_size, clip.shortest_edge, clip.resample) == (
        "CLIPImageProcessor",
        (224, 224),
        224,
        3,
    )
    assert (clip.scale, clip.mean, clip.std) == (
        1 / 255,
        (0.48145466, 0.4578275, 0.40821073),
        (0.26862954, 0.26130258, 0.27577711),
    )
    siglip = ImageProcessing.from_dict(
        {"image_processor_type": "SiglipImageProcessor", "size": {"height": 32, "width": 48}}
    )
    assert (siglip.output_size, siglip.crop, siglip.size) == ((32, 48), None, (32, 48))
    bare = ImageProcessing.from_dict(
        {"image_processor_type": "CLIPImageProcessor", "do_rescale": False, "do_normalize": False}
    )
    assert (bare.scale, bare.mean, bare.std) == (1.0, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    assert (bare.lookup_table() == np.arange(256, dtype=np.float32)).all()


def test_the_workers_formula_in_torch():
    """The documented formula, on torch float32 as the worker runs it: the float64 rescale bit-exact,
    the float32 one within 1e-6, for every byte value of every channel."""
    torch = pytest.importorskip("torch")
    values = torch.arange(256, dtype=torch.uint8).view(1, 1, 256).expand(1, 3, 256)  # [N, C, W]
    for name, cls, kwargs in PROCESSORS:
        ours = ImageProcessing.from_dict(cls(**kwargs).to_dict())
        table = torch.from_numpy(ours.lookup_table())  # [3, 256]
        mean = torch.tensor(ours.mean, dtype=torch.float32).view(1, 3, 1)
        std = torch.tensor(ours.std, dtype=torch.float32).view(1, 3, 1)
        exact = ((values.double() * ours.scale).float() - mean) / std
        assert torch.equal(exact[0], table), name
        fast = (values.float() * ours.scale - mean) / std
        assert (fast[0] - table).abs().max().item() <= 1e-6, name


def test_rgb_only_when_the_processor_does_not_convert():
    reference = SiglipImageProcessorPil(do_convert_rgb=False)
    ours = ImageProcessing.from_dict(reference.to_dict())
    _assert_same(reference, ours, Image.fromarray(_noise(50, 40, 3), "RGB"))
    with pytest.raises(ImageError) as refused:
        ours.pixels(MODES["L"])
    assert str(refused.value) == "this model takes RGB images only (its processor's do_convert_rgb is off), not mode L"


def test_an_extreme_aspect_ratio_is_refused_before_resizing():
    ours = ImageProcessing.from_dict({"image_processor_type": "CLIPImageProcessor"})
    strip = Image.new("RGB", (200_000, 1))
    with pytest.raises(ImageError) as refused:
        ours.pixels(strip)
    assert str(refused.value) == (
        "the image is 200000x1 pixels: its aspect ratio is too extreme for this model, which would resize it "
        f"to 44800000x224 (at least 1 and at most {MAX_RESIZED_PIXELS} pixels)"
    )
    assert ours.resized_size(1, 100) == (224, 22400)  # (height, width), under the limit


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"image_processor_type": "ViTImageProcessor"},
            "image_processor_type 'ViTImageProcessor' is not supported (only CLIPImageProcessor, SiglipImageProcessor)",
        ),
        ({"image_processor_type": "Siglip2ImageProcessorFast"}, "Siglip2ImageProcessor is SigLIP 2's NaFlex processor"),
        ({}, "names no image_processor_type"),
        (
            {"image_processor_type": "CLIPImageProcessor", "auto_map": {"AutoImageProcessor": "x.Y"}},
            "auto_map names a custom image processor (x.Y)",
        ),
        ({"image_processor_type": "CLIPImageProcessor", "do_pad": True, "pad_size": 300}, "do_pad true"),
        (
            {"image_processor_type": "CLIPImageProcessor", "do_center_crop": False},
            "images would come out at their own sizes",
        ),
        ({"image_processor_type": "SiglipImageProcessor", "size": 224}, "images would come out at their own sizes"),
        (
            {"image_processor_type": "SiglipImageProcessor", "size": {"longest_edge": 224}},
            "size {'longest_edge': 224} is not supported",
        ),
        (
            {"image_processor_type": "SiglipImageProcessor", "size": {"height": 224}},
            "size {'height': 224} is not a size",
        ),
        (
            {"image_processor_type": "SiglipImageProcessor", "size": {"height": 0, "width": 2}},
            "must hold positive integers",
        ),
        ({"image_processor_type": "SiglipImageProcessor", "size": None}, "do_resize is true but size is null"),
        (
            {"image_processor_type": "CLIPImageProcessor", "crop_size": None},
            "do_center_crop is true but crop_size is null",
        ),
        (
            {"image_processor_type": "CLIPImageProcessor", "crop_size": {"shortest_edge": 9}},
            "crop_size {'shortest_edge': 9} needs height and width",
        ),
        (
            {"image_processor_type": "CLIPImageProcessor", "resample": 6},
            "resample 6 is not one of PIL's filter codes 0-5",
        ),
        ({"image_processor_type": "CLIPImageProcessor", "resample": None}, "resample None is not one of"),
        (
            {"image_processor_type": "CLIPImageProcessor", "image_mean": [0.5, 0.5]},
            "image_mean is [0.5, 0.5], not a number or 3 numbers",
        ),
        ({"image_processor_type": "CLIPImageProcessor", "image_std": 0}, "image_std 0 has a 0"),
        (
            {"image_processor_type": "CLIPImageProcessor", "rescale_factor": None},
            "rescale_factor is None, not a positive number",
        ),
        (
            {"image_processor_type": "CLIPImageProcessor", "do_resize": "yes"},
            "do_resize must be true, false or null, got 'yes'",
        ),
    ],
)
def test_refused_configs_name_the_option(config, message):
    with pytest.raises(ConfigError) as refused:
        ImageProcessing.from_dict(config, where="cfg.json")
    assert str(refused.value).startswith("cfg.json")
    assert message in str(refused.value)


def test_a_siglip2_folder_is_refused(tmp_path):
    from transformers import Siglip2ImageProcessorPil

    Siglip2ImageProcessorPil().save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="Siglip2ImageProcessor is SigLIP 2's NaFlex processor"):
        ImageProcessing.from_folder(tmp_path)


def test_a_folder_without_a_preprocessor_config_is_refused(tmp_path):
    with pytest.raises(ConfigError) as refused:
        ImageProcessing.from_folder(tmp_path)
    assert (
        str(refused.value) == f"{tmp_path} has no preprocessor_config.json: an image model needs its image processor's"
    )
