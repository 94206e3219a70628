"""A page model's patch rows finished on the device: the uint8 rows the tokenizer fleet prepared
(``PageProcessing.prepare``) rescaled, normalised and repeated over the temporal patch, as transformers'
``Qwen2VLImageProcessor`` makes its ``pixel_values`` (shared/images/pages.py explains the steps).

Each (channel, byte value) has one float32 result, so a gather from a [3, 256] table computed in
transformers' arithmetic on the host is exact on any device (``ByteTable``, which a NaFlex model's patch
rows use too), where recomputing the float64 rescale there would cost a float64 pass over the pixels.
"""

from __future__ import annotations

import numpy as np
import torch

from embedfleet.shared.images.pages import PageProcessing


class ByteTable:
    """uint8 values -> float32 through a [3, 256] table (each (channel, byte value) rescaled and normalised
    in transformers' arithmetic on the host), on ``device``: exact on any device."""

    def __init__(self, table: np.ndarray, device: torch.device) -> None:
        self.table = torch.from_numpy(table).to(device).reshape(-1)  # [3 * 256]: channel c's values at c * 256
        self.offsets = torch.arange(3, device=device) * 256

    def __call__(self, rows: torch.Tensor, channel_axis: int) -> torch.Tensor:
        """``rows`` uint8, with its 3 channels along ``channel_axis`` -> float32 of the same shape."""
        shape = [1] * rows.dim()
        shape[channel_axis] = 3
        return self.table[rows.long() + self.offsets.view(shape)]


class PagePixels:
    """uint8 patch rows [P, 3 * p * p] -> float32 pixel values [P, 3 * T * p * p], equal bit for bit to
    ``PageProcessing.pixel_values`` (and so to transformers' rows), on ``device``."""

    def __init__(self, processing: PageProcessing, device: torch.device) -> None:
        self.area = processing.patch_size**2  # values of a channel in a patch
        self.temporal = processing.temporal_patch_size
        self.table = ByteTable(processing.lookup_table(), device)

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] != 3 * self.area:
            raise ValueError(f"rows must be uint8 [P, {3 * self.area}], got {rows.dtype} {list(rows.shape)}")
        n = rows.shape[0]
        values = self.table(rows.reshape(n, 3, self.area), channel_axis=1)  # [P, 3, p*p] float32
        # (C, T, p*p): the one frame repeated T times, as the processor tiles it
        return values.unsqueeze(2).expand(n, 3, self.temporal, self.area).reshape(n, 3 * self.temporal * self.area)
