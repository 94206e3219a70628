"""A page model's patch rows finished on the device: the uint8 rows the tokenizer fleet prepared
(``PageProcessing.prepare``) rescaled, normalised and repeated over the temporal patch, as transformers'
``Qwen2VLImageProcessor`` makes its ``pixel_values`` (shared/images/pages.py explains the steps).

Each (channel, byte value) has one float32 result, so a gather from a [3, 256] table computed in
transformers' arithmetic on the host is exact on any device, where recomputing the float64 rescale there
would cost a float64 pass over the pixels.
"""

from __future__ import annotations

import torch

from embedfleet.shared.images.pages import PageProcessing


class PagePixels:
    """uint8 patch rows [P, 3 * p * p] -> float32 pixel values [P, 3 * T * p * p], equal bit for bit to
    ``PageProcessing.pixel_values`` (and so to transformers' rows), on ``device``."""

    def __init__(self, processing: PageProcessing, device: torch.device) -> None:
        self.area = processing.patch_size**2  # values of a channel in a patch
        self.temporal = processing.temporal_patch_size
        self.table = torch.from_numpy(processing.lookup_table()).to(device).reshape(-1)  # [3 * 256]
        self.offsets = (torch.arange(3, device=device) * 256).view(1, 3, 1)  # channel c's values at c * 256

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] != 3 * self.area:
            raise ValueError(f"rows must be uint8 [P, {3 * self.area}], got {rows.dtype} {list(rows.shape)}")
        n = rows.shape[0]
        index = rows.reshape(n, 3, self.area).long() + self.offsets  # [P, 3, p*p]
        values = self.table[index]  # [P, 3, p*p] float32
        # (C, T, p*p): the one frame repeated T times, as the processor tiles it
        return values.unsqueeze(2).expand(n, 3, self.temporal, self.area).reshape(n, 3 * self.temporal * self.area)
