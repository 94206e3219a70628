"""A page model's image processor (ColQwen2's: Qwen2-VL's ``Qwen2VLImageProcessor``), applied exactly as
transformers' PIL backend applies it (``Qwen2VLImageProcessorPil``: what ``Qwen2VLImageProcessor`` is where
torchvision is not installed; its torchvision backend resizes otherwise).

Unlike CLIP's processor (preprocess.py), every image keeps its own aspect ratio and comes out at its own
size: a grid of ``gh x gw`` patches, ``gh * gw / merge_size**2`` image tokens in the text.

transformers' steps for one PIL image (image_processing_pil_qwen2_vl, image_processing_backends.PilBackend):

1. RGB (``convert_to_rgb``): as for CLIP (``preprocess.to_rgb``): transparency composited onto white.
2. Resize (``smart_resize``, then ``Image.resize`` on the uint8 image with the config's filter and no
   reducing_gap): each side rounded (half to even) to a multiple of ``factor = patch_size * merge_size``
   (28); a result over ``max_pixels`` is scaled down by ``sqrt(h * w / max_pixels)`` and floored to
   multiples of the factor (at least one factor), one under ``min_pixels`` scaled up and ceiled. An aspect
   ratio over 200 is refused.
3. Rescale and normalise: ``float32(float64(x) * rescale_factor)``, then ``(x - mean) / std`` in float32.
4. Patchify: the [C, H, W] image cut into ``patch_size`` squares, ordered by merge window: the
   (gh / m, gw / m) windows row by row, in each its m x m patches row by row; each row of ``pixel_values``
   is one patch laid out (C, T, p, p): the single frame repeated ``temporal_patch_size`` (T) times.
   ``image_grid_thw`` is [1, gh, gw].

Steps 1-2 run on uint8 in transformers too, so ``prepare`` makes the same Pillow calls and gets the same
bytes. Steps 3-4 commute: step 3 maps each (channel, byte value) to one float32 and step 4 only moves and
copies values, so ``prepare`` lays the uint8 patches out in the processor's order ([gh * gw, C * p * p],
a ``4 * T`` times smaller message than the floats), and ``pixel_values`` (or the worker's
``PagePixels`` on its device) looks each byte up in a [3, 256] table computed in transformers'
arithmetic and repeats it T times: equal bit for bit.

The config (preprocessor_config.json) as ``Qwen2VLImageProcessor.__init__`` reads it: ``size``
``{"shortest_edge": min_pixels, "longest_edge": max_pixels}`` (new configs), replaced key by key by
top-level ``min_pixels`` / ``max_pixels`` (older configs; these win when both are present, and a
``size`` of ``{"min_pixels", "max_pixels"}`` works only beside them); a class attribute for every key
left out.
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
from embedfleet.shared.images.preprocess import (
    _CLIP_MEAN,
    _CLIP_STD,
    MAX_RESIZED_PIXELS,
    RESAMPLE_FILTERS,
    _flag,
    _per_channel,
    _positive,
    _rescale_factor,
    lookup_table,
    processor_config,
    rgb,
)

if TYPE_CHECKING:
    from PIL import Image

PROCESSOR = "Qwen2VLImageProcessor"  # its Fast and Pil names too
MAX_ASPECT_RATIO = 200  # smart_resize raises beyond it


@dataclass(frozen=True, slots=True)
class PageProcessing:
    """What a page model's image processor does to an image; the defaults are ``Qwen2VLImageProcessor``'s
    class attributes, what transformers takes for a key the config leaves out. Sizes are (height, width)."""

    patch_size: int = 14  # pixels a patch side
    temporal_patch_size: int = 2  # frames a patch (T): an image's one frame repeated
    merge_size: int = 2  # patches a merge window side: m * m patches make one image token
    min_pixels: int = 56 * 56  # size.shortest_edge
    max_pixels: int = 28 * 28 * 1280  # size.longest_edge
    resample: int = 3  # PIL's filter code (RESAMPLE_FILTERS): bicubic
    do_rescale: bool = True
    rescale_factor: float = 1 / 255  # 1.0 from a config that does not rescale
    do_normalize: bool = True
    image_mean: tuple[float, float, float] = _CLIP_MEAN  # 0.0 from a config that does not normalise
    image_std: tuple[float, float, float] = _CLIP_STD  # 1.0 from a config that does not normalise
    do_convert_rgb: bool = True  # off: only RGB images are taken

    @classmethod
    def from_folder(cls, folder: Path) -> PageProcessing:
        """A model folder's image processor: processor_config.json's "image_processor" entry, else
        preprocessor_config.json (transformers' order)."""
        config, where = processor_config(Path(folder))
        return cls.from_config(config, where=where)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], where: str = "the image processor config") -> PageProcessing:
        """A preprocessor config's content, the class's defaults for the keys it leaves out. Refused
        (``ConfigError``): another processor class, a bad value, and what transformers would fail on at
        the first image (a size without both pixel bounds, do_resize off: patches of any image size)."""
        _check_processor(cfg, where)
        defaults = cls()  # a slots dataclass keeps no defaults on the class
        ints = {}
        for name in ("patch_size", "temporal_patch_size", "merge_size"):
            value = cfg.get(name, getattr(defaults, name))
            if not _positive(value):
                raise ConfigError(f"{where}: {name} must be a positive integer, got {value!r}")
            ints[name] = value
        flags = {
            name: _flag(cfg.get(name, True), name, where)
            for name in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb")
        }
        if not flags["do_resize"]:
            raise ConfigError(
                f"{where}: do_resize off (each image patched at its own size, which must then be a multiple "
                f"of {ints['patch_size'] * ints['merge_size']}) is not supported"
            )
        resample = cfg.get("resample", defaults.resample)
        if not (isinstance(resample, int) and not isinstance(resample, bool) and 0 <= resample < len(RESAMPLE_FILTERS)):
            raise ConfigError(f"{where}: resample {resample!r} is not one of PIL's filter codes 0-5 {RESAMPLE_FILTERS}")
        min_pixels, max_pixels = _pixel_bounds(cfg, defaults, where)
        normalize = flags["do_normalize"]
        return cls(
            **ints,
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            resample=int(resample),  # a plain int, not transformers' PILImageResampling
            do_rescale=flags["do_rescale"],
            rescale_factor=_rescale_factor(cfg.get("rescale_factor", defaults.rescale_factor), where)
            if flags["do_rescale"]
            else 1.0,
            do_normalize=normalize,
            image_mean=_per_channel(cfg.get("image_mean", defaults.image_mean), "image_mean", where)
            if normalize
            else (0.0, 0.0, 0.0),
            image_std=_per_channel(cfg.get("image_std", defaults.image_std), "image_std", where, nonzero=True)
            if normalize
            else (1.0, 1.0, 1.0),
            do_convert_rgb=flags["do_convert_rgb"],
        )

    @property
    def row_bytes(self) -> int:
        """Bytes of a ``prepare`` row: one patch's uint8 values, C * p * p."""
        return 3 * self.patch_size**2

    @property
    def max_patches(self) -> int:
        """The most patches ``target_size`` gives any image it takes: more than ``max_pixels / p**2`` where
        smart_resize keeps a side at one factor (a long narrow image) or scales a small image up."""
        f, ratio = self.patch_size * self.merge_size, MAX_ASPECT_RATIO
        # scaled down with the short side kept at f: the long side at most sqrt(ratio * max_pixels)
        narrow = f * max(f, math.floor(math.sqrt(ratio * self.max_pixels) / f) * f)
        # scaled up (ceil): each side under its real length + f; the long one at most sqrt(ratio * min_pixels)
        # (+ one f of slack for rounding), the short one sqrt(min_pixels)
        grown = (math.floor(math.sqrt(ratio * self.min_pixels) / f) + 1) * f
        grown *= (math.floor(math.sqrt(self.min_pixels) / f) + 1) * f
        pixels = min(MAX_RESIZED_PIXELS, max(self.max_pixels, narrow, grown))
        return pixels // self.patch_size**2

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        """(H, W) an image of this size is resized to: transformers' ``smart_resize`` (module docstring),
        multiples of ``patch_size * merge_size``. ``ImageError`` where transformers raises (an aspect ratio
        over 200), for an empty image, and past MAX_RESIZED_PIXELS."""
        if height < 1 or width < 1:
            raise ImageError(f"the image is {width}x{height} pixels: it has no pixels")
        if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
            raise ImageError(
                f"the image is {width}x{height} pixels: its aspect ratio "
                f"{max(height, width) / min(height, width):.1f} is over {MAX_ASPECT_RATIO}, the most this model takes"
            )
        size = _smart_resize(height, width, self.patch_size * self.merge_size, self.min_pixels, self.max_pixels)
        if size[0] * size[1] > MAX_RESIZED_PIXELS:  # only a config with max_pixels past it gets here
            raise ImageError(
                f"the image is {width}x{height} pixels: this model would resize it to {size[1]}x{size[0]}, "
                f"more than {MAX_RESIZED_PIXELS} pixels"
            )
        return size

    def prepare(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int]]:
        """(uint8 [gh * gw, 3 * p * p], (gh, gw)): ``image`` converted to RGB and resized as transformers'
        PIL backend does it, cut into the processor's patch rows in its order, each row (C, p, p); before
        rescale, normalisation and the temporal copies (``pixel_values``)."""
        rgb = self._rgb(image)
        height, width = self.target_size(rgb.height, rgb.width)
        resized = np.asarray(rgb.resize((width, height), resample=self.resample, reducing_gap=None))  # [H, W, 3]
        p, m = self.patch_size, self.merge_size
        gh, gw = height // p, width // p
        # [H, W, C] as (gh/m, m, p, gw/m, m, p, C) -> (gh/m, gw/m, m, m, C, p, p): merge windows contiguous
        patches = resized.reshape(gh // m, m, p, gw // m, m, p, 3).transpose(0, 3, 1, 4, 6, 2, 5)
        return patches.reshape(gh * gw, 3 * p * p), (gh, gw)

    def pixel_values(self, rows: np.ndarray) -> np.ndarray:
        """float32 [P, 3 * T * p * p] of ``prepare``'s uint8 rows [P, 3 * p * p]: rescaled, normalised and
        each patch repeated T times, laid out (C, T, p, p) as transformers' ``pixel_values`` rows: equal bit
        for bit."""
        area = self.patch_size**2
        if rows.dtype != np.uint8 or rows.ndim != 2 or rows.shape[1] != 3 * area:
            raise ValueError(f"rows must be uint8 [P, {3 * area}], got {rows.dtype} {list(rows.shape)}")
        channels = np.arange(3).reshape(3, 1)  # broadcast against [P, 3, p*p]
        values = self.lookup_table()[channels, rows.reshape(len(rows), 3, area)]  # [P, 3, p*p]
        frames = np.broadcast_to(values[:, :, None, :], (len(rows), 3, self.temporal_patch_size, area))
        return frames.reshape(len(rows), 3 * self.temporal_patch_size * area)

    def lookup_table(self) -> np.ndarray:
        """float32 [3, 256]: each byte value of each channel rescaled and normalised in transformers'
        arithmetic (``preprocess.lookup_table``); the identity where the processor does neither."""
        return lookup_table(
            self.rescale_factor if self.do_rescale else 1.0,
            self.image_mean if self.do_normalize else (0.0, 0.0, 0.0),
            self.image_std if self.do_normalize else (1.0, 1.0, 1.0),
        )

    def tokens_per_image(self, gh: int, gw: int) -> int:
        """The ``<|image_pad|>`` tokens an image of gh x gw patches takes in the text: one per merge window."""
        return gh * gw // self.merge_size**2

    def _rgb(self, image: Image.Image) -> Image.Image:
        return rgb(image, self.do_convert_rgb)


def _smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' smart_resize, after its aspect ratio check (``round``: half to even, as Python's)."""
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _check_processor(cfg: Mapping[str, Any], where: str) -> None:
    auto_map = cfg.get("auto_map")
    if isinstance(auto_map, dict) and "AutoImageProcessor" in auto_map:
        raise ConfigError(
            f"{where}: auto_map names a custom image processor ({auto_map['AutoImageProcessor']}), which is not run"
        )
    name = cfg.get("image_processor_type")
    if name is None:
        raise ConfigError(f"{where} names no image_processor_type (a page model's is {PROCESSOR})")
    if str(name).removesuffix("Fast").removesuffix("Pil") != PROCESSOR:
        raise ConfigError(f"{where}: image_processor_type {name!r} is not a page model's ({PROCESSOR})")


def _pixel_bounds(cfg: Mapping[str, Any], defaults: PageProcessing, where: str) -> tuple[int, int]:
    """(min_pixels, max_pixels) as ``Qwen2VLImageProcessor.__init__`` merges them: top-level min_pixels /
    max_pixels (unless null) replace size's shortest_edge / longest_edge; a null or absent size is the
    class's; the result must be exactly those two keys, as its resize requires."""
    size = cfg.get("size")
    if size is None:
        size = {"shortest_edge": defaults.min_pixels, "longest_edge": defaults.max_pixels}
    if not isinstance(size, dict):
        raise ConfigError(
            f"{where}: size {size!r} is not a dict of shortest_edge and longest_edge (min and max pixels)"
        )
    size = dict(size)
    for key, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        if cfg.get(key) is not None:
            size[edge] = cfg[key]
            size.pop(key, None)
    if set(size) != {"shortest_edge", "longest_edge"}:
        raise ConfigError(
            f"{where}: size {size} (top-level min_pixels / max_pixels merged in) needs exactly shortest_edge "
            "and longest_edge (min and max pixels)"
        )
    if not all(_positive(value) for value in size.values()):
        raise ConfigError(f"{where}: min and max pixels {size} must be positive integers")
    return size["shortest_edge"], size["longest_edge"]
