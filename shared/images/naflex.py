"""SigLIP 2's NaFlex image processor (``Siglip2ImageProcessor``), applied exactly as transformers' PIL
backend applies it (``Siglip2ImageProcessorPil``).

Each image keeps its aspect ratio: it is resized to the largest grid of ``patch_size`` squares, at most
``max_num_patches`` of them, that the binary search of ``get_image_size_for_max_num_patches`` finds, and
its tower runs those patches (transformers pads every image to ``max_num_patches`` and masks the padding;
the engine runs the real patches alone, which is the same arithmetic for them).

transformers' steps for one PIL image (image_processing_pil_siglip2, image_processing_backends.PilBackend):

1. RGB: ``do_convert_rgb`` is null in the published configs, and transformers then takes the image's own
   bands (a grayscale or RGBA image fails at the normalisation, 1 or 4 channels for a 3-channel mean); here
   such an image is converted as CLIP's processor converts it (``preprocess.to_rgb``), an RGB image being
   unchanged. A config with ``do_convert_rgb: false`` takes RGB images only.
2. Resize (``Image.resize`` on the uint8 image with the config's filter, bilinear by default, no
   reducing_gap) to (gh * p, gw * p): for a scale s, each side ``ceil(side * s / p) * p`` and at least p;
   the largest s in the search's interval with gh * gw <= max_num_patches.
3. Rescale and normalise: ``float32(float64(x) * rescale_factor)``, then ``(x - mean) / std`` in float32.
4. Patchify: [C, H, W] cut into p x p squares row by row, each row of ``pixel_values`` one patch laid out
   (p, p, C), channels last; ``spatial_shapes`` is (gh, gw).

Steps 1-2 run on uint8 in transformers too, so ``prepare`` makes the same Pillow calls and gets the same
bytes; steps 3-4 commute (each (channel, byte value) has one float32), so ``prepare`` gives the uint8 patch
rows in the processor's order ([gh * gw, p * p * C], a quarter of the floats), and ``pixel_values`` (or the
worker, on its device) looks each byte up in a [3, 256] table computed in transformers' arithmetic: equal
bit for bit.
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

PROCESSOR = "Siglip2ImageProcessor"  # its Fast and Pil names too
MAX_PATCHES = 4096  # the most patches a config may ask an image be resized to (published: 256 to 1024)
_EPS = 1e-5  # the binary search's interval, as transformers' default


@dataclass(frozen=True, slots=True)
class NaFlexProcessing:
    """What SigLIP 2's NaFlex processor does to an image; the defaults are ``Siglip2ImageProcessor``'s class
    attributes, what transformers takes for a key the config leaves out. Sizes are (height, width)."""

    patch_size: int = 16
    max_num_patches: int = 256
    resample: int = 2  # PIL's filter code (RESAMPLE_FILTERS): bilinear
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)  # 0.0 from a config that does not normalise
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)  # 1.0 from a config that does not normalise
    do_normalize: bool = True
    do_convert_rgb: bool = True  # null converts too (the module docstring); false: RGB images only

    @classmethod
    def from_folder(cls, folder: Path) -> NaFlexProcessing:
        """A model folder's image processor: processor_config.json's "image_processor" entry, else
        preprocessor_config.json (transformers' order)."""
        config, where = processor_config(Path(folder))
        return cls.from_config(config, where=where)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], where: str = "the image processor config") -> NaFlexProcessing:
        """A preprocessor config's content, the class's defaults for the keys it leaves out. Refused
        (``ConfigError``): another processor class, a bad value, do_resize off (transformers resizes every
        image whatever it says)."""
        name = cfg.get("image_processor_type")
        if name is not None and str(name).removesuffix("Fast").removesuffix("Pil") != PROCESSOR:
            raise ConfigError(
                f"{where}: image_processor_type {name!r} is not SigLIP 2's NaFlex processor ({PROCESSOR})"
            )
        defaults = cls()
        ints = {}
        for key in ("patch_size", "max_num_patches"):
            value = cfg.get(key, getattr(defaults, key))
            if not _positive(value):
                raise ConfigError(f"{where}: {key} must be a positive integer, got {value!r}")
            ints[key] = int(value)
        if ints["max_num_patches"] > MAX_PATCHES:
            raise ConfigError(f"{where}: max_num_patches {ints['max_num_patches']} is over {MAX_PATCHES}")
        resample = cfg.get("resample", defaults.resample)
        if not (isinstance(resample, int) and not isinstance(resample, bool) and 0 <= resample < len(RESAMPLE_FILTERS)):
            raise ConfigError(f"{where}: resample {resample!r} is not one of PIL's filter codes 0-5 {RESAMPLE_FILTERS}")
        rescale = _flag(cfg.get("do_rescale", True), "do_rescale", where)
        normalize = _flag(cfg.get("do_normalize", True), "do_normalize", where)
        convert = cfg.get("do_convert_rgb")
        return cls(
            **ints,
            resample=int(resample),
            do_rescale=rescale,
            rescale_factor=_rescale_factor(cfg.get("rescale_factor", defaults.rescale_factor), where)
            if rescale
            else 1.0,
            image_mean=_per_channel(cfg.get("image_mean", defaults.image_mean), "image_mean", where)
            if normalize
            else (0.0, 0.0, 0.0),
            image_std=_per_channel(cfg.get("image_std", defaults.image_std), "image_std", where, nonzero=True)
            if normalize
            else (1.0, 1.0, 1.0),
            do_normalize=normalize,
            do_convert_rgb=True if convert is None else _flag(convert, "do_convert_rgb", where),
        )

    @property
    def row_bytes(self) -> int:
        """Bytes of a ``prepare`` row: one patch's uint8 values, p * p * C."""
        return 3 * self.patch_size**2

    @property
    def max_patches(self) -> int:
        """The most patches an image is resized to."""
        return self.max_num_patches

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        """(H, W) an image of this size is resized to (transformers' ``get_image_size_for_max_num_patches``),
        multiples of ``patch_size``. ``ImageError`` for an image without pixels."""
        if height < 1 or width < 1:
            raise ImageError(f"the image is {width}x{height} pixels: it has no pixels")
        p = self.patch_size

        def scaled(scale: float, side: int) -> int:
            return max(p, math.ceil(side * scale / p) * p)

        low, high = _EPS / 10, 100.0
        while high - low >= _EPS:
            scale = (low + high) / 2
            if (scaled(scale, height) / p) * (scaled(scale, width) / p) <= self.max_num_patches:
                low = scale
            else:
                high = scale
        return scaled(low, height), scaled(low, width)

    def prepare(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int]]:
        """(uint8 [gh * gw, p * p * 3], (gh, gw)): ``image`` in RGB, resized as transformers' PIL backend
        resizes it and cut into the processor's patch rows, each (p, p, C); before rescale and normalisation."""
        rgb = self._rgb(image)
        height, width = self.target_size(rgb.height, rgb.width)
        resized = np.asarray(rgb.resize((width, height), resample=self.resample, reducing_gap=None))  # [H, W, 3]
        p = self.patch_size
        gh, gw = height // p, width // p
        patches = resized.reshape(gh, p, gw, p, 3).transpose(0, 2, 1, 3, 4)  # (gh, gw, p, p, C)
        return np.ascontiguousarray(patches).reshape(gh * gw, p * p * 3), (gh, gw)

    def pixel_values(self, rows: np.ndarray) -> np.ndarray:
        """float32 [P, p * p * 3] of ``prepare``'s uint8 rows: rescaled and normalised as transformers'
        ``pixel_values`` rows (without its padding rows): equal bit for bit."""
        if rows.dtype != np.uint8 or rows.ndim != 2 or rows.shape[1] != self.row_bytes:
            raise ValueError(f"rows must be uint8 [P, {self.row_bytes}], got {rows.dtype} {list(rows.shape)}")
        channels = np.arange(3).reshape(1, 1, 3)  # channels last: broadcast against [P, p*p, 3]
        values = self.lookup_table()[channels, rows.reshape(len(rows), -1, 3)]
        return values.reshape(len(rows), self.row_bytes)

    def lookup_table(self) -> np.ndarray:
        """float32 [3, 256]: each byte value of each channel rescaled and normalised in transformers' arithmetic."""
        return lookup_table(
            self.rescale_factor if self.do_rescale else 1.0,
            self.image_mean if self.do_normalize else (0.0, 0.0, 0.0),
            self.image_std if self.do_normalize else (1.0, 1.0, 1.0),
        )

    def _rgb(self, image: Image.Image) -> Image.Image:
        return rgb(image, self.do_convert_rgb)
