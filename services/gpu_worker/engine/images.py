"""A two-tower model's image path on one replica: uint8 pixels in (as the tokenizer prepared them),
rescaled and normalised on the device as the folder's image processor does, through the image tower,
one vector per image out.

Every image of a model has the same shape, so a batch of n images is a fixed-shape forward: with CUDA
graphs a batch runs in the smallest image-count bucket >= n (powers of two up to the budget's image
count, and that count), captured lazily as the token buckets are (graphs.py); the pad images' outputs
are never read. Larger batches, and every CPU batch, run eagerly.

A NaFlex model's images (SigLIP 2: ``PatchImagePath``) each come at their own grid, as patch rows: every
batch runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from embedfleet.services.gpu_worker.engine.graphs import GraphCache, Replay
from embedfleet.services.gpu_worker.engine.linear import LinearOps
from embedfleet.services.gpu_worker.engine.page_pixels import ByteTable
from embedfleet.shared.images.naflex import NaFlexProcessing
from embedfleet.shared.images.preprocess import ImageProcessing


def image_buckets(max_images: int) -> list[int]:
    """Image counts a graph is captured for: 1, 2, 4, ... below ``max_images``, and ``max_images``."""
    sizes, n = [], 1
    while n < max_images:
        sizes.append(n)
        n *= 2
    return [*sizes, max(1, max_images)]


class ImagePath:
    """One replica's image tower runs: eager, or replayed from graphs bucketed by image count."""

    def __init__(
        self,
        vision: nn.Module,
        processing: ImageProcessing,
        device: torch.device,
        dtype: torch.dtype,
        ops: LinearOps,
        dim: int,
    ) -> None:
        self.vision, self.processing = vision, processing
        self.device, self.dtype, self.ops, self.dim = device, dtype, ops, dim
        self.shape = (3, *processing.output_size)
        # the processor's arithmetic as device constants (no host copy inside a captured graph)
        self.scale = processing.scale if processing.do_rescale else 1.0
        self.mean = torch.tensor(processing.mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(processing.std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        self.graphs: GraphCache | None = None
        self._static_pixels: torch.Tensor | None = None
        self._static_out: torch.Tensor | None = None

    def use_graphs(self, max_images: int, capture: Callable[[Callable[[], None]], Replay]) -> None:
        """Replay batches of up to ``max_images`` from graphs that ``capture`` makes of a static forward."""
        buckets = image_buckets(max_images)
        self._static_pixels = torch.zeros((buckets[-1], *self.shape), dtype=torch.uint8, device=self.device)
        self._static_out = torch.zeros(buckets[-1], self.dim, dtype=torch.float32, device=self.device)
        self.graphs = GraphCache(buckets, lambda n: capture(lambda: self._static_forward(n)))

    def normalized(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 [N, C, S, S] -> float32, rescaled then normalised as the image processor does."""
        x = pixels.float()
        if self.processing.do_rescale:
            x = x * self.scale
        if self.processing.do_normalize:
            x = (x - self.mean) / self.std
        return x

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Device pixels [N, C, S, S] uint8 -> [N, dim] float32."""
        return self.vision(self.normalized(pixels).to(self.dtype), self.ops)

    def run(self, pixels: np.ndarray) -> tuple[torch.Tensor, str]:
        """Host pixels [N, C, S, S] uint8 -> (device vectors [N, dim] float32, how it ran)."""
        host = torch.from_numpy(pixels if pixels.flags.writeable else pixels.copy())
        if self.device.type == "cuda":
            host = host.pin_memory()
        n = len(pixels)
        bucket = self.graphs.bucket_for(n) if self.graphs is not None else None
        if bucket is None:
            return self.forward(host.to(self.device, non_blocking=True)), "eager"
        assert self._static_pixels is not None and self._static_out is not None and self.graphs is not None
        self._static_pixels[:n].copy_(host, non_blocking=True)
        ran = self.graphs.run(bucket, eager=lambda: self._static_forward(bucket))
        return self._static_out[:n], ran

    def _static_forward(self, n: int) -> None:
        assert self._static_pixels is not None and self._static_out is not None  # set up by use_graphs
        self._static_out[:n].copy_(self.forward(self._static_pixels[:n]))


class PatchImagePath:
    """One replica's runs of a NaFlex image tower: uint8 patch rows [P, p * p * C] (channels last, as
    ``NaFlexProcessing.prepare`` lays them out) rescaled and normalised on the device through a [3, 256]
    table in transformers' arithmetic (equal bit for bit to ``pixel_values``), then the tower per grid."""

    def __init__(
        self, vision: Any, processing: NaFlexProcessing, device: torch.device, dtype: torch.dtype, ops: LinearOps
    ) -> None:
        self.vision, self.processing = vision, processing
        self.device, self.dtype, self.ops = device, dtype, ops
        self.table = ByteTable(processing.lookup_table(), device)

    def run(self, rows: np.ndarray, grids: np.ndarray) -> tuple[torch.Tensor, str]:
        """Host patch rows and grids [N, 2] -> (device vectors [N, dim] float32, how it ran)."""
        host = torch.from_numpy(rows if rows.flags.writeable else rows.copy())
        if self.device.type == "cuda":
            host = host.pin_memory()
        on_device = host.to(self.device, non_blocking=True)
        n = on_device.shape[0]
        values = self.table(on_device.view(n, -1, 3), channel_axis=2).view(n, -1)  # channels last
        shapes = tuple((int(h), int(w)) for h, w in grids)
        return self.vision.forward_patches(values.to(self.dtype), shapes, self.ops), "eager"
