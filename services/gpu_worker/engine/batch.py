"""Host-side preparation of a packed batch: positions, pooling indices, optional padding to a bucket.

Everything here is numpy on the host; ``DeviceBatch`` moves it to the device in one go. Padding
(for CUDA graphs) appends one dummy sequence holding the pad tokens, then zero-length rows up to a
fixed row count, so every tensor has a shape that depends on the bucket only.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch


@dataclass(slots=True)
class HostBatch:
    input_ids: np.ndarray  # [N] int64 (N = real tokens, or the bucket when padded)
    positions: np.ndarray  # [N] int64
    token_types: np.ndarray  # [N] int64
    cu_seqlens: np.ndarray  # [R + 1] int32 (R = real rows, or the fixed row count when padded)
    seq_ids: np.ndarray  # [N] int64: the row of each token
    first: np.ndarray  # [R] int64: index of each row's first token (cls pooling)
    last: np.ndarray  # [R] int64: index of each row's last token (last-token pooling)
    lengths: np.ndarray  # [R] float32: tokens per row (>= 1, for mean pooling)
    keep: np.ndarray  # [N] float32: 1 for a token pooling counts, 0 for a skipped prompt token
    kept: np.ndarray  # [R] float32: tokens per row that pooling counts (>= 1)
    adapters: np.ndarray  # [N] int64: each token's task adapter (0: none; layers/lora.py)
    rows: int  # real rows (the first ``rows`` outputs are real)
    max_len: int  # longest row, padding included


def prepare(
    input_ids: np.ndarray,
    cu_seqlens: np.ndarray,
    position_offset: int,
    pad_to: int | None = None,
    rows_to: int | None = None,
    token_types: np.ndarray | None = None,
    skip: np.ndarray | None = None,
    adapters: np.ndarray | None = None,
) -> HostBatch:
    """``skip``: [rows] leading tokens of each row that pooling does not count (include_prompt=false);
    ``adapters``: [rows] each row's task adapter (0: none), given to each of its tokens."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    tokens, rows = int(cu[-1]), len(cu) - 1
    n = pad_to or tokens
    r = rows_to or rows
    if n < tokens or r < rows + (n > tokens):
        raise ValueError(f"cannot pad {tokens} tokens / {rows} rows to {n} / {r}")
    if n > tokens:
        cu = np.append(cu, n)  # the dummy row holding the pad tokens
    cu = np.concatenate([cu, np.full(r + 1 - len(cu), n, dtype=np.int64)])  # zero-length rows
    lengths = np.diff(cu)
    ids = np.zeros(n, dtype=np.int64)
    ids[:tokens] = input_ids
    types = np.zeros(n, dtype=np.int64)
    if token_types is not None:
        types[:tokens] = token_types
    seq_ids = np.repeat(np.arange(r, dtype=np.int64), lengths)
    offsets = np.arange(n, dtype=np.int64) - cu[seq_ids]  # each token's index within its row
    first = np.minimum(cu[:-1], n - 1)
    last = np.maximum(cu[1:] - 1, 0)
    keep = np.ones(n, dtype=np.float32)
    kept = np.maximum(lengths, 1).astype(np.float32)
    if skip is not None:
        skips = np.zeros(r, dtype=np.int64)
        skips[:rows] = skip
        keep = (offsets >= skips[seq_ids]).astype(np.float32)
        kept = np.maximum(np.bincount(seq_ids, weights=keep, minlength=r), 1).astype(np.float32)
        first = np.minimum(first + skips, last)  # cls: the first token counted, as sentence-transformers takes it
    per_token = np.zeros(n, dtype=np.int64)
    if adapters is not None:
        per_row = np.zeros(r, dtype=np.int64)
        per_row[:rows] = adapters
        per_token = per_row[seq_ids]
    return HostBatch(
        input_ids=ids,
        positions=offsets + position_offset,
        token_types=types,
        cu_seqlens=cu.astype(np.int32),
        seq_ids=seq_ids,
        first=first,
        last=last,
        lengths=np.maximum(lengths, 1).astype(np.float32),
        keep=keep,
        kept=kept,
        adapters=per_token,
        rows=rows,
        max_len=int(lengths.max(initial=1)),
    )


_ARRAYS = [f.name for f in fields(HostBatch) if f.name not in ("rows", "max_len")]


@dataclass(slots=True)
class Pages:
    """A page model's images in one batch (ColQwen2): their patch rows, as its vision tower takes them, and
    each image's patch grid. Image ``i`` fills, in order, the ``gh * gw / merge**2`` image tokens of the
    batch's ids that follow image ``i - 1``'s."""

    patches: torch.Tensor  # [P, C * temporal * patch * patch] in the model's dtype, on the device, normalised
    grids: tuple[tuple[int, int], ...]  # (gh, gw) patches per image, in the order their tokens come


class DeviceBatch:
    """Device tensors for one HostBatch, each field under the same name."""

    # HostBatch's arrays (its shapes and dtypes), set from _ARRAYS in __init__
    input_ids: torch.Tensor
    positions: torch.Tensor
    token_types: torch.Tensor
    cu_seqlens: torch.Tensor
    seq_ids: torch.Tensor
    first: torch.Tensor
    last: torch.Tensor
    lengths: torch.Tensor
    keep: torch.Tensor
    kept: torch.Tensor
    adapters: torch.Tensor

    def __init__(self, host: HostBatch, device: torch.device) -> None:
        pin = device.type == "cuda"
        for name in _ARRAYS:
            t = torch.from_numpy(getattr(host, name))
            if pin:
                t = t.pin_memory()  # async host-to-device copy
            setattr(self, name, t.to(device, non_blocking=True))
        self.rows = host.rows
        self.max_len = host.max_len
        self.pages: Pages | None = None  # a page model's images (ColQwen2), set by the engine


class StaticBatch:
    """Fixed device buffers that captured graphs read from; refilled before every replay."""

    def __init__(self, max_tokens: int, max_rows: int, device: torch.device) -> None:
        def buf(n: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(n, dtype=dtype, device=device)

        self.input_ids = buf(max_tokens, torch.int64)
        self.positions = buf(max_tokens, torch.int64)
        self.token_types = buf(max_tokens, torch.int64)
        self.seq_ids = buf(max_tokens, torch.int64)
        self.cu_seqlens = buf(max_rows + 1, torch.int32)
        self.first = buf(max_rows, torch.int64)
        self.last = buf(max_rows, torch.int64)
        self.lengths = torch.ones(max_rows, dtype=torch.float32, device=device)
        self.keep = torch.ones(max_tokens, dtype=torch.float32, device=device)
        self.kept = torch.ones(max_rows, dtype=torch.float32, device=device)
        self.adapters = buf(max_tokens, torch.int64)
        self.max_rows = max_rows

    def load(self, host: HostBatch) -> None:
        pin = self.input_ids.device.type == "cuda"
        for name in _ARRAYS:
            src = torch.from_numpy(getattr(host, name))
            if pin:
                src = src.pin_memory()
            getattr(self, name)[: len(src)].copy_(src, non_blocking=True)

    def view(self, tokens: int) -> StaticView:
        return StaticView(self, tokens)


class StaticView:
    """The first ``tokens`` entries of the static token buffers (same storage, fixed addresses)."""

    def __init__(self, static: StaticBatch, tokens: int) -> None:
        self.input_ids = static.input_ids[:tokens]
        self.positions = static.positions[:tokens]
        self.token_types = static.token_types[:tokens]
        self.seq_ids = static.seq_ids[:tokens]
        self.keep = static.keep[:tokens]
        self.adapters = static.adapters[:tokens]
        self.cu_seqlens = static.cu_seqlens
        self.first, self.last, self.lengths, self.kept = static.first, static.last, static.lengths, static.kept
        self.pages: Pages | None = None  # captured graphs run texts only
