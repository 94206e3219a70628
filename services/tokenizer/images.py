"""Images prepared for a two-tower model's image tower: each file decoded (its header checked against
the limits before any pixel is), resized and cropped as the folder's image processor does, as uint8
[C, H, W] pixels; then cut into chunks that fit a NATS message. Rescaling and normalising are left to
the worker (on its device, in the model's arithmetic): a uint8 pixel is a quarter of a float32 one on
the wire."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.images.decode import ImageError, ImageLimits, open_image
from embedfleet.shared.images.preprocess import ImageProcessing
from embedfleet.shared.model_dir.info import ModelInfo

# room in a chunk's message for everything but its pixels (ids, options, timings, spans of headers)
_ENVELOPE_BYTES = 16 << 10


@dataclass(frozen=True, slots=True)
class ImagePreparer:
    processing: ImageProcessing
    tokens: int  # what one image runs through the tower: patches + the class token
    limits: ImageLimits = field(default_factory=ImageLimits)

    @classmethod
    def for_model(cls, model: ModelInfo, limits: ImageLimits | None = None) -> ImagePreparer | None:
        """The preparer of ``model``'s images; None for a model that embeds texts only."""
        if "image" not in model.inputs or model.pages or model.patch_images:  # PagePreparer's (pages.py)
            return None
        return cls(ImageProcessing.from_folder(model.path), model.image_tokens, limits or ImageLimits())

    def prepare(self, files: list[bytes]) -> np.ndarray | ServiceError:
        """One request's images -> pixels [N, C, H, W] uint8, or the error of the first that fails
        (an INVALID_REQUEST naming its row)."""
        out = np.empty((len(files), 3, *self.processing.output_size), dtype=np.uint8)
        for i, data in enumerate(files):
            try:
                out[i] = self.pixels(data)
            except ImageError as exc:
                return ServiceError(ErrorCode.INVALID_REQUEST, str(exc), row=i, noun="image")
        return out

    def pixels(self, data: bytes) -> np.ndarray:
        """One image file -> pixels [C, H, W] uint8; ImageError when it is refused or cannot be decoded."""
        return self.processing.pixels(open_image(data, self.limits))

    def prepare_each(self, requests: list[list[bytes]]) -> list[np.ndarray | ServiceError]:
        return [self.prepare(files) for files in requests]

    def chunks(self, pixels: np.ndarray, max_payload: int, max_rows: int) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, pixels [n, C, H, W]) of each chunk: as many images as fit one message, at most ``max_rows``."""
        each = int(np.prod(pixels.shape[1:]))
        per_chunk = max(1, min(max_rows, (max_payload - _ENVELOPE_BYTES) // each))
        for start in range(0, len(pixels), per_chunk):
            yield start, pixels[start : start + per_chunk]

    def cu_seqlens(self, images: int) -> np.ndarray:
        """[images + 1] int32: each image counted as the tokens its tower runs."""
        return (np.arange(images + 1, dtype=np.int32) * self.tokens).astype(np.int32)
