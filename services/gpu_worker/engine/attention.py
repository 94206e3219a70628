"""Attention over packed variable-length sequences (no padding), one backend per device.

Each backend is bound once per batch to the sequence bounds (``bind``), then called by every layer
with q of shape [T, heads, head_dim] and k, v of shape [T, kv_heads, head_dim] (grouped-query
attention when kv_heads < heads), and the layer's :class:`AttnMask`: bidirectional or causal, an
optional window, an optional softmax scale, an optional additive bias (MPNet's relative positions),
an optional tanh cap on the scores (Gemma2's soft-capping: only the SDPA backend's explicit path takes it).
``capturable`` backends read the bounds from device memory only, so a CUDA graph captured with them
is valid for any batch of the same token bucket.
"""

from __future__ import annotations

import inspect
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

log = logging.getLogger("embedfleet.engine")

SDPA_GQA = torch.__version__ >= "2.5"  # SDPA's enable_gqa: kv heads shared without copying them
FLASHINFER_HEAD_DIMS = (64, 128, 256)  # FlashInfer's prefill kernels; 32 (MiniLM, bge-small) is not among them

# length L -> additive scores bias [heads, L, L] for a sequence of L tokens (depends on j - i only)
BiasFn = Callable[[int], torch.Tensor]


@dataclass(frozen=True, slots=True)
class AttnMask:
    """Which keys a query sees within its own sequence, and how scores are scaled.

    ``window``: query i sees key j only where |i - j| <= window (with ``causal``: i - window <= j <= i).
    ``bias``: added to the scores; the same for every sequence of a length (relative positions).
    ``softcap``: scores (after scaling) become softcap * tanh(score / softcap) before masking (Gemma2);
    no fused kernel does this, so only SDPA's explicit path serves it.
    """

    causal: bool = False
    window: int | None = None
    scale: float | None = None  # None: 1 / sqrt(head_dim)
    bias: BiasFn | None = None
    softcap: float | None = None

    @property
    def plain(self) -> bool:
        return not self.causal and self.window is None and self.bias is None

    @property
    def fused(self) -> bool:
        """Whether a fused attention kernel can serve it (no score bias, no capping)."""
        return self.bias is None and self.softcap is None

    def describe(self) -> str:
        kind = "causal" if self.causal else "bidirectional"
        if self.window is not None:
            kind += f", window {'-' if self.causal else '±'}{self.window}"
        kind += ", relative-position bias" if self.bias is not None else ""
        return kind + (f", scores capped at ±{self.softcap:g} (tanh)" if self.softcap is not None else "")


FULL = AttnMask()


class Attention(Protocol):
    name: str
    capturable: bool

    def bind(
        self,
        cu_host: np.ndarray,
        cu_dev: torch.Tensor,
        max_len: int,
        graph_key: int | None = None,
        real_tokens: int | None = None,
    ) -> None:
        """Set this batch's sequence bounds: host copy, device copy, longest sequence. Tokens from
        ``real_tokens`` on are padding whose outputs are never read: a backend may skip them."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttnMask = FULL) -> torch.Tensor:
        """q [T, heads, d], k and v [T, kv_heads, d] -> [T, heads, d]."""


def _structure(length: int, mask: AttnMask, device: torch.device) -> torch.Tensor | None:
    """[L, L] bool: key j visible to query i, from the mask's causality and window (None: all)."""
    window = _window(mask, length)
    if not mask.causal and window is None:
        return None
    i = torch.arange(length, device=device)
    rel = i[None, :] - i[:, None]  # j - i
    keep = torch.ones(length, length, dtype=torch.bool, device=device)
    if mask.causal:
        keep &= rel <= 0
    if window is not None:
        keep &= rel.abs() <= window
    return keep


def _window(mask: AttnMask, length: int) -> int | None:
    """The mask's window where it hides keys in a sequence of ``length`` tokens; None where every key
    is within it (short sequences under ModernBERT's or Gemma3's local layers: no mask, the fast kernel)."""
    return mask.window if mask.window is not None and mask.window < length - 1 else None


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    mask: AttnMask,
    gqa: dict[str, Any],
) -> torch.Tensor:
    """q [n, heads, L, d], k and v [n, kv_heads, L, d] -> [n, heads, L, d]: SDPA, or with a score cap
    the same math spelled out (transformers' eager attention: scale, cap, mask, softmax in float32)."""
    if mask.softcap is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=mask.scale, **gqa
        )
    if k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = mask.scale if mask.scale is not None else q.shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale  # [n, heads, L, L]
    scores = torch.tanh(scores / mask.softcap) * mask.softcap
    if is_causal:
        length = q.shape[2]
        attn_mask = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    if attn_mask is not None:
        scores = (
            scores.masked_fill(~attn_mask, float("-inf"))
            if attn_mask.dtype == torch.bool
            else scores + attn_mask.float()
        )
    return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)


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
        self._masks: dict[tuple, torch.Tensor | None] = {}  # this batch's masks, by (length, AttnMask)

    def bind(
        self,
        cu_host: np.ndarray,
        cu_dev: torch.Tensor,
        max_len: int,
        graph_key: int | None = None,
        real_tokens: int | None = None,
    ) -> None:
        if real_tokens is not None and real_tokens < int(cu_host[-1]):
            cu_host = cu_host[cu_host <= real_tokens]  # the padding rows (a CPU batch's dummy row): not attended
        self._covered = int(cu_host[-1])
        cu = cu_host.tolist()
        runs: list[tuple[int, int, int]] = []
        for s, e in itertools.pairwise(cu):
            if e == s:
                continue
            if runs and runs[-1][2] == e - s and runs[-1][0] + runs[-1][1] * runs[-1][2] == s:
                start, n, length = runs[-1]
                runs[-1] = (start, n + 1, length)
            else:
                runs.append((s, 1, e - s))
        self._runs = runs
        self._pad = None
        self._masks = {}
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

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttnMask = FULL) -> torch.Tensor:
        gqa: dict[str, Any] = {}  # enable_gqa where SDPA has it (passed only then)
        if k.shape[1] != q.shape[1]:  # grouped-query attention: each kv head serves heads / kv_heads queries
            if SDPA_GQA:
                gqa = {"enable_gqa": True}
            else:
                group = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        if self._pad is not None:
            return self._padded(self._pad, q, k, v, mask, gqa)
        out = torch.empty_like(q)
        if self._covered < len(q):
            out[self._covered :].zero_()
        heads, d = q.shape[1], q.shape[2]
        for start, n, length in self._runs:
            end = start + n * length
            # [n * L, heads, d] -> [n, heads, L, d]: 4-D inputs take the fused (flash) kernel on CPU;
            # 3-D ones fall back to the unfused math path (several times slower)
            causal = mask.causal and _window(mask, length) is None and mask.bias is None
            qs, ks, vs = (t[start:end].view(n, length, t.shape[1], d).transpose(1, 2) for t in (q, k, v))
            o = _sdpa(qs, ks, vs, None if causal else self._run_mask(length, mask, q), causal, mask, gqa)
            out[start:end].view(n, length, heads, d).copy_(o.transpose(1, 2))
        return out

    def _run_mask(self, length: int, mask: AttnMask, q: torch.Tensor) -> torch.Tensor | None:
        """The mask of one sequence of ``length`` tokens: None, [L, L] bool or [heads, L, L] float;
        made once per batch and length."""
        if mask.plain:
            return None
        key = (length, mask)
        if key not in self._masks:
            keep = _structure(length, mask, q.device)
            if mask.bias is None:
                self._masks[key] = keep
            else:
                bias = mask.bias(length).to(q.dtype)
                self._masks[key] = bias if keep is None else bias.masked_fill(~keep, float("-inf"))
        return self._masks[key]

    def _padded(
        self,
        padding: tuple[torch.Tensor, torch.Tensor, int, int],
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: AttnMask,
        gqa: dict[str, Any],
    ) -> torch.Tensor:
        """``padding``: this batch's (``_pad``)."""
        positions, _keep, n, longest = padding
        heads, d = q.shape[1], q.shape[2]

        def pad(t: torch.Tensor) -> torch.Tensor:
            padded = t.new_zeros(n * longest, t.shape[1], d)
            padded.index_copy_(0, positions, t[: self._covered])
            return padded.view(n, longest, t.shape[1], d).transpose(1, 2)

        o = _sdpa(pad(q), pad(k), pad(v), self._padded_mask(padding, mask, q), False, mask, gqa)
        o = o.transpose(1, 2).reshape(n * longest, heads, d)
        if self._covered == len(q):
            return o.index_select(0, positions)
        out = q.new_zeros(q.shape)
        torch.index_select(o, 0, positions, out=out[: self._covered])
        return out

    def _padded_mask(
        self, padding: tuple[torch.Tensor, torch.Tensor, int, int], mask: AttnMask, q: torch.Tensor
    ) -> torch.Tensor:
        """[n, 1, L, L] bool, or [n, heads, L, L] float with a bias: a query sees its own sequence's
        keys as the mask allows; a padding query row sees all its sequence's keys (never nothing: no
        NaN, and never read)."""
        key = ("padded", mask)
        found = self._masks.get(key)  # never None for this key
        if found is None:
            _, keep, _n, longest = padding  # keep: [n, 1, 1, L] real keys
            structure = _structure(longest, mask, q.device)
            if structure is not None:
                pad_rows = ~keep.transpose(-1, -2)  # [n, 1, L, 1]: padding query rows
                keep = keep & (structure | pad_rows)
            if mask.bias is not None:
                keep = mask.bias(longest).to(q.dtype)[None].masked_fill(~keep, float("-inf"))
            self._masks[key] = found = keep
        return found


class TorchFlashVarlen:
    """PyTorch's flash-attention varlen kernel (CUDA, fp16/bf16): bounds read from device memory;
    causal, symmetric windows (``window_size``) and grouped-query attention where this PyTorch has them."""

    name = "torch-flash-varlen"
    capturable = True

    def __init__(self) -> None:
        from torch.nn.attention.varlen import varlen_attn

        self._varlen_attn = varlen_attn
        params = inspect.signature(varlen_attn).parameters
        self.windows = "window_size" in params
        self.gqa = "enable_gqa" in params
        self._cu: torch.Tensor | None = None
        self._max_len = 0

    def supports(self, mask: AttnMask, grouped: bool) -> bool:
        if not mask.fused or (grouped and not self.gqa):
            return False
        return self.windows or (not mask.causal and mask.window is None)

    def bind(
        self,
        cu_host: np.ndarray,
        cu_dev: torch.Tensor,
        max_len: int,
        graph_key: int | None = None,
        real_tokens: int | None = None,
    ) -> None:
        self._cu, self._max_len = cu_dev, max_len

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttnMask = FULL) -> torch.Tensor:
        # q, k, v are strided views of the fused QKV output: the kernel wants dense rows
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        kwargs: dict[str, Any] = {}  # what this PyTorch's varlen attention takes, passed only when needed
        if mask.scale is not None:
            kwargs["scale"] = mask.scale
        if k.shape[1] != q.shape[1]:
            kwargs["enable_gqa"] = True
        if mask.causal or mask.window is not None:
            left = -1 if mask.window is None else mask.window
            kwargs["window_size"] = (left, 0 if mask.causal else left)
        assert self._cu is not None  # bound before every forward
        out = self._varlen_attn(q, k, v, self._cu, self._cu, self._max_len, self._max_len, **kwargs)
        assert isinstance(out, torch.Tensor)  # the output alone: no auxiliary outputs asked
        return out


class FlashInferRagged:
    """FlashInfer's ragged prefill (CUDA): bidirectional, or causal with an optional left window;
    grouped-query attention native. Planned on the host per batch and per distinct mask; in graph
    mode one wrapper per bucket and mask is bound to the static bounds buffer and re-planned before
    each replay."""

    name = "flashinfer"
    capturable = True
    WORKSPACE_BYTES = 128 << 20

    def __init__(
        self,
        heads: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        masks: tuple[AttnMask, ...],
    ) -> None:
        import flashinfer  # optional dependency, imported only when chosen

        self._flashinfer = flashinfer
        self._heads, self._kv_heads, self._head_dim, self._dtype = heads, kv_heads, head_dim, dtype
        self._masks = tuple(dict.fromkeys(masks))
        self._workspace = torch.empty(self.WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._eager = {m: flashinfer.BatchPrefillWithRaggedKVCacheWrapper(self._workspace, "NHD") for m in self._masks}
        # FlashInfer's wrappers (an untyped package)
        self._graph_wrappers: dict[tuple[int, AttnMask], Any] = {}
        self._active: dict[AttnMask, Any] = self._eager

    @staticmethod
    def supports(mask: AttnMask) -> bool:
        return mask.fused and (mask.window is None or mask.causal)

    def bind(
        self,
        cu_host: np.ndarray,
        cu_dev: torch.Tensor,
        max_len: int,
        graph_key: int | None = None,
        real_tokens: int | None = None,
    ) -> None:
        indptr = torch.from_numpy(np.ascontiguousarray(cu_host, dtype=np.int32))
        active = {}
        for mask in self._masks:
            if graph_key is None:
                wrapper = self._eager[mask]
            else:
                wrapper = self._graph_wrappers.get((graph_key, mask))
                if wrapper is None:
                    wrapper = self._flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
                        self._workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=cu_dev, kv_indptr_buf=cu_dev
                    )
                    self._graph_wrappers[(graph_key, mask)] = wrapper
            wrapper.plan(
                indptr,
                indptr,
                self._heads,
                self._kv_heads,
                self._head_dim,
                causal=mask.causal,
                window_left=-1 if mask.window is None else mask.window,
                sm_scale=mask.scale,
                q_data_type=self._dtype,
            )
            active[mask] = wrapper
        self._active = active

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttnMask = FULL) -> torch.Tensor:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return self._active[mask].run(q, k, v)


def select_attention(
    heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    prefer: str = "auto",
    *,
    kv_heads: int | None = None,
    masks: tuple[AttnMask, ...] = (FULL,),
) -> Attention:
    """FlashInfer on CUDA where installed and the head size and masks allow; PyTorch's flash varlen
    on CUDA otherwise; SDPA everywhere else (and whenever asked for, and for score biases)."""
    kv_heads = kv_heads or heads
    if device.type != "cuda" or prefer == "sdpa":
        return SdpaVarlen()
    half = dtype in (torch.float16, torch.bfloat16)
    flashinfer_ok = head_dim in FLASHINFER_HEAD_DIMS and half and all(FlashInferRagged.supports(m) for m in masks)
    if prefer in ("auto", "flashinfer") and flashinfer_ok:
        try:
            return FlashInferRagged(heads, kv_heads, head_dim, dtype, device, masks)
        except ImportError:
            if prefer == "flashinfer":
                raise
            log.info("flashinfer is not installed; using PyTorch's flash varlen attention")
    elif prefer == "flashinfer":
        raise ValueError(
            f"FlashInfer does not support this model (head size {head_dim}, {dtype}, masks "
            f"{', '.join(m.describe() for m in masks)}): it needs head size 64/128/256, half precision, no score bias or cap "
            "and no symmetric window"
        )
    if half:
        try:
            flash = TorchFlashVarlen()
        except ImportError:
            log.info("this PyTorch has no varlen attention; using SDPA per sequence")
        else:
            if all(flash.supports(m, kv_heads != heads) for m in masks):
                return flash
            log.info("PyTorch's flash varlen attention cannot take this model's masks; using SDPA (no CUDA graphs)")
    return SdpaVarlen()
