"""A model folder's image processor (preprocessor_config.json), applied exactly as transformers' PIL
backend applies it (``CLIPImageProcessorPil``, ``SiglipImageProcessorPil``: what ``CLIPImageProcessor``
and ``SiglipImageProcessor`` are where torchvision is not installed; its torchvision backend resizes otherwise).

transformers' steps for one PIL image (image_processing_backends.PilBackend, image_transforms):

1. RGB (``convert_to_rgb``): an image with an alpha band or a ``transparency`` entry (P, L or RGB with
   tRNS) is converted to RGBA and composited onto opaque white, then to RGB; any other mode is
   ``convert("RGB")`` (CMYK naively, I;16 clipped to 255, 1-bit to 0/255).
2. Resize (``resize``): the uint8 array back into a PIL image, ``Image.resize`` with the config's
   filter and no reducing_gap; to (height, width), or the shortest edge to ``shortest_edge`` with the
   other ``int(shortest_edge * long / short)`` (truncated, not rounded).
3. Center crop (``center_crop``): offsets ``(size - crop) // 2``; an image smaller than the crop is
   padded with zeros, ``ceil((crop - size) / 2)`` of them before it.
4. Rescale (``rescale``): ``float32(float64(x) * rescale_factor)``.
5. Normalize (``normalize``): ``(x - float32(mean)) / float32(std)`` in float32.

Steps 1-3 run on uint8 in transformers too (the array goes back into PIL as uint8 and comes out as
uint8: no float step), so ``pixels`` makes the same Pillow calls and slicing and gets the same bytes. Steps
4-5 map each (channel, byte value) to one float32, whatever its neighbours, so ``normalize`` looks them up
in a [3, 256] table computed in transformers' arithmetic: equal bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.images.decode import ImageError
from embedfleet.shared.model_dir.folder import read_json

if TYPE_CHECKING:
    from PIL import Image

# an image resized to more pixels than this is refused (a 1 x 100000 strip, its short edge resized to 224):
# transformers would try, with gigabytes of memory
MAX_RESIZED_PIXELS = 40_000_000
RESAMPLE_FILTERS = ("nearest", "lanczos", "bilinear", "bicubic", "box", "hamming")  # by PIL's code, 0..5

_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # transformers' OPENAI_CLIP_MEAN / _STD
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# each class's attributes: what transformers takes for an option the config leaves out (an option the
# config sets to null stays None: transformers keeps the config's null over the class's value)
_DEFAULTS: dict[str, dict[str, Any]] = {
    "CLIPImageProcessor": dict(
        do_convert_rgb=True,
        do_resize=True,
        size={"shortest_edge": 224},
        default_to_square=False,
        resample=3,  # bicubic
        do_center_crop=True,
        crop_size={"height": 224, "width": 224},
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=_CLIP_MEAN,
        image_std=_CLIP_STD,
        do_pad=None,
    ),
    "SiglipImageProcessor": dict(
        do_convert_rgb=True,
        do_resize=True,
        size={"height": 224, "width": 224},
        default_to_square=False,
        resample=3,
        do_center_crop=None,
        crop_size=None,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=(0.5, 0.5, 0.5),  # IMAGENET_STANDARD_MEAN / _STD
        image_std=(0.5, 0.5, 0.5),
        do_pad=None,
    ),
}
# the processor class of a folder whose preprocessor config names none (transformers: config.json's model_type)
_BY_MODEL_TYPE = {"clip": "CLIPImageProcessor", "siglip": "SiglipImageProcessor", "siglip2": "Siglip2ImageProcessor"}
_NO_RESIZE: dict[str, Any] = dict(size=None, shortest_edge=None, longest_edge=None, resample=2)
# transformers' accepted key sets of a size option (image_processing_utils.VALID_SIZE_DICT_KEYS)
_SIZE_KEYS = "height width | shortest_edge | shortest_edge longest_edge | longest_edge | max_height max_width"
_SIZE_KEYS += " | min_pixels max_pixels"


@dataclass(frozen=True, slots=True)
class ImageProcessing:
    """What a folder's image processor does to an image; sizes are (height, width) in pixels.

    The worker's half (``scale``, ``mean``, ``std``), exact formula, per channel c and uint8 value x::

        y = (float32(float64(x) * scale) - float32(mean[c])) / float32(std[c])   # each op rounded to float32

    ``scale`` is 1.0 when the processor does not rescale, ``mean`` 0.0 and ``std`` 1.0 when it does not
    normalise, so the formula holds for every config. In torch, ``((x.double() * scale).float() - mean32)
    / std32`` (mean32, std32: float32 tensors [3, 1, 1]) is bit-exact on CPU (tested), and on CUDA by the
    same IEEE rounding (PyTorch is built without fast math); ``(x.float() * scale - mean32) / std32`` rounds
    ``x * scale`` in float32, at most 1 ulp of 1.0 off before dividing: within 3e-7 of transformers.
    ``lookup_table()`` holds every value of the formula, for a gather (``table[c, x]``).
    """

    processor: str  # "CLIPImageProcessor" | "SiglipImageProcessor"
    convert_rgb: bool  # do_convert_rgb; off: only RGB images are taken
    do_resize: bool
    size: tuple[int, int] | None  # resize to (height, width) exactly
    shortest_edge: int | None  # else the short edge to this, keeping the aspect ratio
    longest_edge: int | None  # ... and the long edge at most this (shortest_edge then shrinks)
    resample: int  # PIL's filter code (RESAMPLE_FILTERS)
    crop: tuple[int, int] | None  # center crop to (height, width), zero-padded where the image is smaller
    do_rescale: bool
    scale: float  # rescale_factor (1/255); 1.0 when do_rescale is off
    do_normalize: bool
    mean: tuple[float, float, float]  # image_mean by RGB channel; 0.0 when do_normalize is off
    std: tuple[float, float, float]  # image_std; 1.0 when do_normalize is off

    @classmethod
    def from_folder(cls, folder: Path) -> ImageProcessing:
        """A model folder's image processor: processor_config.json's "image_processor" entry, else
        preprocessor_config.json (transformers' order); config.json's model_type names the class when
        neither names one."""
        folder = Path(folder)
        config, where = processor_config(folder)
        model_config = read_json(folder / "config.json")
        model_type = model_config.get("model_type") if isinstance(model_config, dict) else None
        return cls.from_dict(config, where=where, model_type=model_type)

    @classmethod
    def from_dict(
        cls, config: Mapping[str, Any], where: str = "the image processor config", model_type: str | None = None
    ) -> ImageProcessing:
        """A preprocessor config's content, its class's defaults for the options it leaves out (as
        transformers fills them). Refused: another processor class, an option's bad value, padding, and
        any config whose images would not all come out at one size. Keys these processors never read
        (processor_class, data_format, return_tensors, a stray option of another class) are ignored, as
        transformers ignores them."""
        processor = _processor_name(config, where, model_type)
        given = {key: config[key] for key in _DEFAULTS[processor] if key in config}
        options = {**_DEFAULTS[processor], **given}
        if processor == "CLIPImageProcessor" and config.get("use_square_size"):
            # CLIPImageProcessor.__init__ (for KOSMOS-2): the class's shortest edge, squared, whatever size says
            options["size"] = {"height": 224, "width": 224}
        flags = {
            name: _flag(options[name], name, where)
            for name in ("do_convert_rgb", "do_resize", "do_center_crop", "do_rescale", "do_normalize", "do_pad")
        }
        if flags["do_pad"]:
            raise ConfigError(f"{where}: do_pad true (padding after normalisation) is not supported")
        square = _flag(options["default_to_square"], "default_to_square", where)
        resize = _resize(options, square, where) if flags["do_resize"] else _NO_RESIZE
        crop = _crop(options["crop_size"], where) if flags["do_center_crop"] else None
        if crop is None and resize["size"] is None:
            raise ConfigError(
                f"{where}: images would come out at their own sizes (neither a center crop nor a resize to "
                "height and width): only processors with one output size are supported"
            )
        normalize = flags["do_normalize"]
        return cls(
            processor=processor,
            convert_rgb=flags["do_convert_rgb"],
            do_resize=flags["do_resize"],
            **resize,
            crop=crop,
            do_rescale=flags["do_rescale"],
            scale=_rescale_factor(options["rescale_factor"], where) if flags["do_rescale"] else 1.0,
            do_normalize=normalize,
            mean=_per_channel(options["image_mean"], "image_mean", where) if normalize else (0.0, 0.0, 0.0),
            std=_per_channel(options["image_std"], "image_std", where, nonzero=True) if normalize else (1.0, 1.0, 1.0),
        )

    @property
    def output_size(self) -> tuple[int, int]:
        """(height, width) of every image's pixels."""
        size = self.crop or self.size
        assert size is not None  # from_dict refuses a config without either
        return size

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) an image of this size is resized to (before the crop), as transformers computes
        it; ``ImageError`` when that is over MAX_RESIZED_PIXELS or under one pixel."""
        if not self.do_resize:
            return height, width
        if self.size is not None:
            return self.size
        assert self.shortest_edge is not None  # from_dict: a resize is to a size or a shortest edge
        if self.longest_edge is not None:
            out = _size_with_aspect_ratio(height, width, self.shortest_edge, self.longest_edge)
        else:
            out = _shortest_edge_size(height, width, self.shortest_edge)
        if out[0] < 1 or out[1] < 1 or out[0] * out[1] > MAX_RESIZED_PIXELS:
            raise ImageError(
                f"the image is {width}x{height} pixels: its aspect ratio is too extreme for this model, which "
                f"would resize it to {out[1]}x{out[0]} (at least 1 and at most {MAX_RESIZED_PIXELS} pixels)"
            )
        return out

    def pixels(self, image: Image.Image) -> np.ndarray:
        """uint8 [3, H, W] (H, W: ``output_size``): ``image`` converted to RGB, resized and center-cropped
        as transformers' PIL backend does it, before rescale and normalisation."""
        rgb = self._rgb(image)
        if self.do_resize:
            height, width = self.resized_size(rgb.height, rgb.width)
            rgb = rgb.resize((width, height), resample=self.resample, reducing_gap=None)
        array = np.asarray(rgb)  # [H, W, 3] uint8
        if self.crop is not None:
            array = _center_crop(array, *self.crop)
        return np.ascontiguousarray(array.transpose(2, 0, 1))

    def normalize(self, pixels: np.ndarray) -> np.ndarray:
        """float32 of ``pixels``' shape ([3, H, W] or [N, 3, H, W] uint8): rescaled and normalised, equal
        bit for bit to transformers' pixel_values."""
        if pixels.dtype != np.uint8 or pixels.ndim not in (3, 4) or pixels.shape[-3] != 3:
            raise ValueError(f"pixels must be uint8 [3, H, W] or [N, 3, H, W], got {pixels.dtype} {list(pixels.shape)}")
        channels = np.arange(3).reshape(3, 1, 1)  # broadcast against [..., 3, H, W]
        return self.lookup_table()[channels, pixels]

    def lookup_table(self) -> np.ndarray:
        """float32 [3, 256]: the normalised value of each byte value in each channel, computed in
        transformers' arithmetic (rescale: float64 product rounded to float32; normalise: float32)."""
        return lookup_table(self.scale, self.mean, self.std)

    def _rgb(self, image: Image.Image) -> Image.Image:
        return rgb(image, self.convert_rgb)


def processor_config(folder: Path) -> tuple[dict[str, Any], str]:
    """A model folder's image processor config and where it was read: processor_config.json's
    "image_processor" entry, else preprocessor_config.json (transformers' order)."""
    nested = read_json(folder / "processor_config.json")
    if isinstance(nested, dict) and isinstance(nested.get("image_processor"), dict):
        config, where = nested["image_processor"], f"{folder / 'processor_config.json'} (image_processor)"
    else:
        path = folder / "preprocessor_config.json"
        if not path.is_file():
            raise ConfigError(f"{folder} has no preprocessor_config.json: an image model needs its image processor's")
        config, where = read_json(path), str(path)
    if not isinstance(config, dict):
        raise ConfigError(f"{where} is not a JSON object")
    return config, where


def rgb(image: Image.Image, convert: bool) -> Image.Image:
    """``image`` as a processor takes it: converted (``to_rgb``) when its do_convert_rgb is on; else an RGB
    image as it is, any other refused (transformers would make 1, 2 or 4 channels of it and fail to normalise)."""
    if convert:
        return to_rgb(image)
    if image.mode != "RGB":
        raise ImageError(
            f"this model takes RGB images only (its processor's do_convert_rgb is off), not mode {image.mode}"
        )
    return image


def to_rgb(image: Image.Image) -> Image.Image:
    """transformers' ``convert_to_rgb``: an image with an alpha band or a ``transparency`` entry composited
    onto opaque white, any other ``convert("RGB")``."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        from PIL import Image

        rgba = image.convert("RGBA")
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def lookup_table(scale: float, mean: tuple[float, float, float], std: tuple[float, float, float]) -> np.ndarray:
    """float32 [3, 256]: ``(float32(float64(x) * scale) - float32(mean[c])) / float32(std[c])`` for each
    channel c and byte value x, in transformers' arithmetic (its rescale, then its float32 normalize)."""
    values = np.arange(256, dtype=np.uint8)
    rescaled = (values.astype(np.float64) * scale).astype(np.float32)  # [256]
    mean32 = np.asarray(mean, dtype=np.float32)[:, None]  # [3, 1]
    std32 = np.asarray(std, dtype=np.float32)[:, None]
    return (rescaled[None, :] - mean32) / std32


def _processor_name(config: Mapping[str, Any], where: str, model_type: str | None) -> str:
    auto_map = config.get("auto_map")
    if isinstance(auto_map, dict) and "AutoImageProcessor" in auto_map:
        raise ConfigError(
            f"{where}: auto_map names a custom image processor ({auto_map['AutoImageProcessor']}), which is not run"
        )
    name = config.get("image_processor_type")
    if name is None and config.get("feature_extractor_type") is not None:
        name = str(config["feature_extractor_type"]).replace("FeatureExtractor", "ImageProcessor")
    if name is None and model_type is not None:
        name = _BY_MODEL_TYPE.get(str(model_type))
        if name is None:
            raise ConfigError(
                f"{where} names no image_processor_type, and model_type {model_type!r} has no supported one"
            )
    if name is None:
        raise ConfigError(f"{where} names no image_processor_type")
    base = str(name).removesuffix("Fast").removesuffix("Pil")
    if base == "Siglip2ImageProcessor":
        raise ConfigError(
            f"{where}: Siglip2ImageProcessor is SigLIP 2's NaFlex processor (each image resized to its own "
            "patch grid), served with a NaFlex checkpoint (config.json's model_type 'siglip2'), not with this "
            "one; fixed-resolution checkpoints ship SiglipImageProcessor"
        )
    if base not in _DEFAULTS:
        raise ConfigError(f"{where}: image_processor_type {name!r} is not supported (only {', '.join(_DEFAULTS)})")
    return base


def _flag(value: Any, name: str, where: str) -> bool:
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"{where}: {name} must be true, false or null, got {value!r}")
    return bool(value)  # null: off, as transformers reads it


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _size_dict(value: Any, default_to_square: bool, name: str, where: str) -> dict[str, Any]:
    """transformers' get_size_dict: an int is a square or a shortest edge, a pair is (height, width)."""
    if _positive(value):
        return {"height": value, "width": value} if default_to_square else {"shortest_edge": value}
    if isinstance(value, list | tuple) and len(value) == 2:
        value = {"height": value[0], "width": value[1]}
    if not isinstance(value, dict) or set(value) not in [set(keys.split()) for keys in _SIZE_KEYS.split(" | ")]:
        raise ConfigError(
            f"{where}: {name} {value!r} is not a size (an int, [height, width] or a dict of {_SIZE_KEYS})"
        )
    if not all(_positive(v) for v in value.values()):
        raise ConfigError(f"{where}: {name} {value!r} must hold positive integers")
    return value


def _resize(options: dict[str, Any], default_to_square: bool, where: str) -> dict[str, Any]:
    """The resize's fields of ``ImageProcessing`` (size, shortest_edge, longest_edge, resample)."""
    if options["size"] is None:
        raise ConfigError(f"{where}: do_resize is true but size is null")
    size = _size_dict(options["size"], default_to_square, "size", where)
    resample = options["resample"]
    if not (isinstance(resample, int) and not isinstance(resample, bool) and 0 <= resample < len(RESAMPLE_FILTERS)):
        raise ConfigError(f"{where}: resample {resample!r} is not one of PIL's filter codes 0-5 {RESAMPLE_FILTERS}")
    if set(size) == {"height", "width"}:
        return dict(size=(size["height"], size["width"]), shortest_edge=None, longest_edge=None, resample=resample)
    if "shortest_edge" in size:
        return dict(
            size=None, shortest_edge=size["shortest_edge"], longest_edge=size.get("longest_edge"), resample=resample
        )
    raise ConfigError(
        f"{where}: size {size} is not supported (height and width, shortest_edge, or shortest_edge and longest_edge are)"
    )


def _crop(value: Any, where: str) -> tuple[int, int]:
    if value is None:
        raise ConfigError(f"{where}: do_center_crop is true but crop_size is null")
    size = _size_dict(value, True, "crop_size", where)  # transformers: an int crop_size is always a square
    if set(size) != {"height", "width"}:
        raise ConfigError(f"{where}: crop_size {size} needs height and width")
    return size["height"], size["width"]


def _rescale_factor(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{where}: do_rescale is true but rescale_factor is {value!r}, not a positive number")
    return float(value)


def _per_channel(value: Any, name: str, where: str, nonzero: bool = False) -> tuple[float, float, float]:
    """image_mean / image_std: one number for every channel, or one per RGB channel."""
    values = [value] * 3 if isinstance(value, int | float) and not isinstance(value, bool) else value
    if not (
        isinstance(values, list | tuple)
        and len(values) == 3
        and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values)
    ):
        raise ConfigError(f"{where}: do_normalize is true but {name} is {value!r}, not a number or 3 numbers")
    if nonzero and 0 in values:
        raise ConfigError(f"{where}: {name} {value!r} has a 0 (images would be divided by it)")
    return float(values[0]), float(values[1]), float(values[2])


def _shortest_edge_size(height: int, width: int, shortest: int) -> tuple[int, int]:
    """transformers' get_resize_output_image_size(default_to_square=False): the long edge truncated."""
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(shortest * long / short)
    return (new_long, shortest) if width <= height else (shortest, new_long)


def _size_with_aspect_ratio(height: int, width: int, shortest: int, longest: int) -> tuple[int, int]:
    """transformers' get_size_with_aspect_ratio: the short edge to ``shortest`` unless the long edge
    would pass ``longest``, then the long edge to ``longest`` (rounded), the short one truncated."""
    raw = None
    if max(height, width) / min(height, width) * shortest > longest:
        raw = longest * min(height, width) / max(height, width)
        shortest = round(raw)  # banker's rounding, as transformers' int(round(...))
    if (height <= width and height == shortest) or (width <= height and width == shortest):
        return height, width
    if width < height:
        return int((raw if raw is not None else shortest) * height / width), shortest
    return shortest, int((raw if raw is not None else shortest) * width / height)


def _center_crop(array: np.ndarray, height: int, width: int) -> np.ndarray:
    """[height, width, 3] from the middle of ``array`` [H, W, 3]; an edge shorter than the crop is
    padded with zeros (ceil of half the difference before it), as transformers' center_crop does."""
    rows, row_pad = _crop_span(array.shape[0], height)
    cols, col_pad = _crop_span(array.shape[1], width)
    inner = array[rows, cols]
    if row_pad == 0 and col_pad == 0:  # the crop fits: no padding
        return inner
    out = np.zeros((height, width, array.shape[2]), dtype=array.dtype)
    out[row_pad : row_pad + inner.shape[0], col_pad : col_pad + inner.shape[1]] = inner
    return out


def _crop_span(length: int, crop: int) -> tuple[slice, int]:
    """The pixels of one axis kept, and the zeros before them."""
    if crop <= length:
        start = (length - crop) // 2
        return slice(start, start + crop), 0
    return slice(0, length), (crop - length + 1) // 2
