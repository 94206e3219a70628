"""Images prepared for a page model (ColQwen2), whose images are tokens inside a text: each file decoded
(its header checked against the limits before any pixel is) and resized as the folder's Qwen2-VL
processor resizes it, cut into uint8 patch rows (shared/images/pages.py); its row of token ids is the
processor's page prompt with the one image token repeated once per merged patch window, as
ColQwen2Processor expands it. Rescaling and normalising are left to the worker, on its device.

A NaFlex model's images (SigLIP 2: shared/images/naflex.py) travel the same way, patch rows and a grid
each, but they are no text: their rows have no token ids and count as their patches."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.images.decode import ImageError, ImageLimits, open_image
from embedfleet.shared.images.naflex import NaFlexProcessing
from embedfleet.shared.images.pages import PageProcessing
from embedfleet.shared.model_dir.info import ModelInfo

# room in a chunk's message for everything but its patch rows and ids (options, timings, headers)
_ENVELOPE_BYTES = 16 << 10


@dataclass(frozen=True, slots=True)
class Page:
    """One prepared image: its row's token ids (none for a NaFlex image), its patch rows [gh * gw, C * p * p]
    uint8, its grid."""

    ids: np.ndarray  # [L] int32
    patches: np.ndarray
    grid: tuple[int, int]

    @property
    def tokens(self) -> int:
        """What its row counts as: its token ids, or a NaFlex image's patches (the tokens its tower runs)."""
        return len(self.ids) if len(self.ids) else len(self.patches)

    @property
    def counted(self) -> np.ndarray:
        """Its row as the tokenizer's metrics count it: its ids, or a zero a patch."""
        return self.ids if len(self.ids) else np.zeros(len(self.patches), np.int32)


@dataclass(frozen=True, slots=True)
class PagePreparer:
    processing: PageProcessing | NaFlexProcessing
    before: np.ndarray  # the page prompt's ids before its image token (int32)
    after: np.ndarray  # and after it
    image_token: int  # -1: a NaFlex model's images, no text around them
    limits: ImageLimits = field(default_factory=ImageLimits)

    @classmethod
    def for_model(
        cls, model: ModelInfo, encoder: TextEncoder, limits: ImageLimits | None = None
    ) -> PagePreparer | None:
        """The preparer of ``model``'s images; None for a model that is not a page model or a NaFlex model."""
        if model.patch_images:
            none = np.zeros(0, np.int32)
            return cls(NaFlexProcessing.from_folder(model.path), none, none, -1, limits or ImageLimits())
        if model.image_token_id < 0:
            return None
        ids = np.asarray(encoder.encode([model.page_prompt], truncate=False)[0], dtype=np.int32)
        at = np.flatnonzero(ids == model.image_token_id)
        if len(at) != 1:
            raise ConfigError(
                f"{model.path}: the page prompt {model.page_prompt!r} must tokenize to exactly one image token "
                f"(id {model.image_token_id}); it has {len(at)}"
            )
        return cls(
            PageProcessing.from_folder(model.path),
            ids[: at[0]],
            ids[at[0] + 1 :],
            model.image_token_id,
            limits or ImageLimits(),
        )

    def page(self, data: bytes) -> Page:
        """One image file -> its Page; ImageError when it is refused or cannot be decoded."""
        patches, (gh, gw) = self.processing.prepare(open_image(data, self.limits))
        if not isinstance(self.processing, PageProcessing):  # a NaFlex image: no text
            return Page(self.before, patches, (gh, gw))
        pads = np.full(self.processing.tokens_per_image(gh, gw), self.image_token, dtype=np.int32)
        return Page(np.concatenate([self.before, pads, self.after]), patches, (gh, gw))

    def prepare(self, files: list[bytes]) -> list[Page] | ServiceError:
        """One request's images -> its Pages, or the error of the first that fails (an INVALID_REQUEST naming its row)."""
        pages = []
        for i, data in enumerate(files):
            try:
                pages.append(self.page(data))
            except ImageError as exc:
                return ServiceError(ErrorCode.INVALID_REQUEST, str(exc), row=i, noun="image")
        return pages

    def prepare_each(self, requests: list[list[bytes]]) -> list[list[Page] | ServiceError]:
        return [self.prepare(files) for files in requests]

    @staticmethod
    def chunks(pages: list[Page], max_payload: int, max_rows: int) -> Iterator[tuple[int, int]]:
        """[lo, hi) of each chunk: as many pages as fit one message (one alone may not: the caller's
        check of the message's size refuses it), at most ``max_rows``."""
        lo = 0
        while lo < len(pages):
            hi, size = lo, _ENVELOPE_BYTES
            while hi < len(pages) and hi - lo < max_rows:
                cost = pages[hi].patches.nbytes + 4 * len(pages[hi].ids) + 8
                if hi > lo and size + cost > max_payload:
                    break
                size, hi = size + cost, hi + 1
            yield lo, hi
            lo = hi


def pack_pages(pages: list[Page]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids [T] int32, cu_seqlens [n + 1] int32, patch rows [P, width] uint8, grids [n, 2] int32) of ``pages``."""
    lengths = np.array([p.tokens for p in pages], dtype=np.int32)
    cu = np.zeros(len(pages) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    return (
        np.concatenate([p.ids for p in pages]).astype(np.int32, copy=False),
        cu,
        np.concatenate([p.patches for p in pages]),
        np.array([p.grid for p in pages], dtype=np.int32).reshape(-1, 2),
    )
