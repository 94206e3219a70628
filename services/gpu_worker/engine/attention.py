"""Non-causal attention over packed variable-length sequences (no padding), one backend per device.

Each backend is bound once per batch to the sequence bounds (``bind``), then called by every layer
with q, k, v of shape [T, heads, head_dim]. ``capturable`` backends read the bounds from device
memory only, so a CUDA graph captured with them is valid for any batch of the same token bucket.
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

log = logging.getLogger("embedfleet.engine")

FLASHINFER_HEAD_DIMS = (64, 128, 256)  # FlashInfer's prefill kernels; 32 (MiniLM, bge-small) is not among them


class Attention(Protocol):
    name: str
    capturable: bool

    def bind(
        self, cu_host: np.ndarray, cu_dev: torch.Tensor, max_len: int, graph_key: int | None = None,
        real_tokens: int | None = None,
    ) -> None:
        """Set this batch's sequence bounds: host copy, device copy, longest sequence. Tokens from
        ``real_tokens`` on are padding whose outputs are never read: a backend may skip them."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """[T, heads, d] x3 -> [T, heads, d]."""


class SdpaVarlen:
    """PyTorch SDPA over packed sequences: every device and head size; not capturable.

    Consecutive sequences of the same length (common: documents truncated at the limit) form one
    [n, heads, L, d] call on a view of the packed tensor. A batch of many sequences of different
    lengths (online queries) is padded into one [n, heads, L_max, d] call with a key mask instead of
    one call per sequence, when padding at most doubles its tokens: one kernel launch per layer in
    place of dozens (on CPU each costs ~30 µs, far more than a short sequence's attention).
    """

    name = "sdpa"
    capturable = False
    PAD_MIN_RUNS = 3  # padding pays once it replaces this many calls
    PAD_MAX_GROWTH = 2.0  # ... and grows the batch's tokens at most this much

    def __init__(self) -> None:
        self._runs: list[tuple[int, int, int]] = []  # (start, sequences, length)
        self._pad: tuple[torch.Tensor, torch.Tensor, int, int] | None = None  # positions, key mask, n, L_max
        self._covered = 0  # tokens attended; the rest (padding) get zeros

    def bind(
        self, cu_host: np.ndarray, cu_dev: torch.Tensor, max_len: int, graph_key: int | None = None,
        real_tokens: int | None = None,
    ) -> None:
        if real_tokens is not None and real_tokens < int(cu_host[-1]):
            cu_host = cu_host[cu_host <= real_tokens]  # the padding rows (a CPU batch's dummy row): not attended
        self._covered = int(cu_host[-1])
        cu = cu_host.tolist()
        runs: list[tuple[int, int, int]] = []
        for s, e in zip(cu[:-1], cu[1:]):
            if e == s:
                continue
            if runs and runs[-1][2] == e - s and runs[-1][0] + runs[-1][1] * runs[-1][2] == s:
                start, n, length = runs[-1]
                runs[-1] = (start, n + 1, length)
            else:
                runs.append((s, 1, e - s))
        self._runs = runs
        self._pad = None
        lengths = np.diff(cu_host)
        lengths = lengths[lengths > 0]
        total = int(lengths.sum())
        if len(runs) >= self.PAD_MIN_RUNS and len(lengths) * int(lengths.max()) <= self.PAD_MAX_GROWTH * total:
            n, longest = len(lengths), int(lengths.max())
            starts = np.repeat(np.arange(n) * longest, lengths)  # each token's row start in the padded batch
            offsets = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            positions = torch.from_numpy(starts + offsets).to(cu_dev.device)
            keep = torch.from_numpy(np.arange(longest)[None, :] < lengths[:, None]).to(cu_dev.device)
            self._pad = (positions, keep[:, None, None, :], n, longest)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self._pad is not None:
            return self._padded(q, k, v)
        out = torch.empty_like(q)
        if self._covered < len(q):
            out[self._covered :].zero_()
        heads, d = q.shape[1], q.shape[2]
        for start, n, length in self._runs:
            end = start + n * length
            # [n * L, heads, d] -> [n, heads, L, d]: 4-D inputs take the fused (flash) kernel on CPU;
            # 3-D ones fall back to the unfused math path (several times slower)
            o = F.scaled_dot_product_attention(
                *(t[start:end].view(n, length, heads, d).transpose(1, 2) for t in (q, k, v))
            )
            out[start:end].view(n, length, heads, d).copy_(o.transpose(1, 2))
        return out

    def _padded(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        positions, keep, n, longest = self._pad
        heads, d = q.shape[1], q.shape[2]

        def pad(t: torch.Tensor) -> torch.Tensor:
            padded = t.new_zeros(n * longest, heads, d)
            padded.index_copy_(0, positions, t[: self._covered])
            return padded.view(n, longest, heads, d).transpose(1, 2)

        # padded query rows attend to their sequence's keys too (never to nothing): no NaN, and unread
        o = F.scaled_dot_product_attention(pad(q), pad(k), pad(v), attn_mask=keep)
        o = o.transpose(1, 2).reshape(n * longest, heads, d)
        if self._covered == len(q):
            return o.index_select(0, positions)
        out = q.new_zeros(q.shape)
        torch.index_select(o, 0, positions, out=out[: self._covered])
        return out


class TorchFlashVarlen:
    """PyTorch's flash-attention varlen kernel (CUDA, fp16/bf16): bounds read from device memory."""

    name = "torch-flash-varlen"
    capturable = True

    def __init__(self) -> None:
        from torch.nn.attention.varlen import varlen_attn

        self._varlen_attn = varlen_attn
        self._cu: torch.Tensor | None = None
        self._max_len = 0

    def bind(
        self, cu_host: np.ndarray, cu_dev: torch.Tensor, max_len: int, graph_key: int | None = None,
        real_tokens: int | None = None,
    ) -> None:
        self._cu, self._max_len = cu_dev, max_len

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q, k, v are strided views of the fused QKV output: the kernel wants dense rows
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return self._varlen_attn(q, k, v, self._cu, self._cu, self._max_len, self._max_len)


class FlashInferRagged:
    """FlashInfer's ragged non-causal prefill (CUDA). Planned on the host per batch; in graph mode
    one wrapper per bucket is bound to the static bounds buffer and re-planned before each replay."""

    name = "flashinfer"
    capturable = True
    WORKSPACE_BYTES = 128 << 20

    def __init__(self, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        import flashinfer  # optional dependency, imported only when chosen

        self._flashinfer = flashinfer
        self._heads, self._head_dim, self._dtype = heads, head_dim, dtype
        self._workspace = torch.empty(self.WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._eager = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(self._workspace, "NHD")
        self._graph_wrappers: dict[int, object] = {}
        self._active = self._eager

    def bind(
        self, cu_host: np.ndarray, cu_dev: torch.Tensor, max_len: int, graph_key: int | None = None,
        real_tokens: int | None = None,
    ) -> None:
        if graph_key is None:
            wrapper = self._eager
        else:
            wrapper = self._graph_wrappers.get(graph_key)
            if wrapper is None:
                wrapper = self._flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
                    self._workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=cu_dev, kv_indptr_buf=cu_dev
                )
                self._graph_wrappers[graph_key] = wrapper
        indptr = torch.from_numpy(np.ascontiguousarray(cu_host, dtype=np.int32))
        wrapper.plan(
            indptr, indptr, self._heads, self._heads, self._head_dim, causal=False, q_data_type=self._dtype
        )
        self._active = wrapper

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return self._active.run(q, k, v)


def select_attention(heads: int, head_dim: int, dtype: torch.dtype, device: torch.device, prefer: str = "auto") -> Attention:
    """FlashInfer on CUDA where installed and the head size allows; PyTorch's flash varlen on CUDA
    otherwise; SDPA everywhere else (and whenever asked for)."""
    if device.type != "cuda" or prefer == "sdpa":
        return SdpaVarlen()
    if prefer in ("auto", "flashinfer") and head_dim in FLASHINFER_HEAD_DIMS and dtype in (torch.float16, torch.bfloat16):
        try:
            return FlashInferRagged(heads, head_dim, dtype, device)
        except ImportError:
            if prefer == "flashinfer":
                raise
            log.info("flashinfer is not installed; using PyTorch's flash varlen attention")
    elif prefer == "flashinfer":
        raise ValueError(f"FlashInfer does not support head size {head_dim} / {dtype}")
    if dtype in (torch.float16, torch.bfloat16):
        try:
            return TorchFlashVarlen()
        except ImportError:
            log.info("this PyTorch has no varlen attention; using SDPA per sequence")
    return SdpaVarlen()
