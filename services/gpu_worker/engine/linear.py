"""Linear layers with their epilogue (activation, residual add) fused where the device allows.

On CPU in fp32 (and in bf16 where the CPU has bf16 instructions), oneDNN's fused linear (the kernels
PyTorch's compiler emits for CPU) runs the GEMM faster than the default BLAS path and folds GELU or
the residual add into it. Elsewhere, and when this PyTorch lacks those kernels, the same calls fall
back to plain ``F.linear``.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger("embedfleet.engine")

# activation name (HF config) -> (oneDNN post-op, its algorithm)
_ONEDNN_ACT = {
    "gelu": ("gelu", "none"),
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
    "silu": ("swish", ""),
    "swish": ("swish", ""),
}
_TORCH_ACT = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),  # CLIP's: no fused oneDNN post-op computes it
}


def activation(name: str):
    """The HF activation ``name`` as a function on tensors."""
    return _TORCH_ACT[name]


class LinearOps:
    """Plain PyTorch: ``F.linear`` then the epilogue."""

    name = "torch"

    def linear(self, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
        return F.linear(x, layer.weight, layer.bias)

    def linear_act(self, x: torch.Tensor, layer: nn.Linear, activation: str) -> torch.Tensor:
        return _TORCH_ACT[activation](F.linear(x, layer.weight, layer.bias))

    def gated(self, x: torch.Tensor, layer: nn.Linear, activation: str) -> torch.Tensor:
        """act(gate) * up, where ``layer`` computes [gate | up] (its first half of rows is the gate)."""
        gate, up = F.linear(x, layer.weight, layer.bias).chunk(2, dim=-1)
        return _TORCH_ACT[activation](gate) * up

    def linear_add(self, x: torch.Tensor, layer: nn.Linear, residual: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return F.linear(x, layer.weight, layer.bias) + residual
        return torch.addmm(residual if layer.bias is None else residual + layer.bias, x, layer.weight.t())


class OneDnnLinearOps(LinearOps):
    """oneDNN fused linear + post-op (CPU, fp32 or bf16), on weights reordered once into oneDNN's blocked
    layout (a plain weight is reordered on every call: 25-35% of a small batch's GEMM time)."""

    name = "onednn"
    # below this many multiply-adds the plain path is faster: oneDNN's call costs ~50 µs before any
    # work, F.linear's ~20 (a 17 x 64 x 192 GEMM: 79 vs 24 µs; 17 x 384 x 1152: 386 vs 435 µs)
    SMALL_MACS = 1 << 21

    def __init__(self, small_macs: int = SMALL_MACS) -> None:
        self.small_macs = small_macs  # GEMMs under this many multiply-adds take the plain path
        self._op = torch.ops.mkldnn._linear_pointwise
        self._packed: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(layer) -> (its weight, packed)
        # id(layer) -> (its weight, packed gate half, packed up half, gate bias, up bias)
        self._halves: dict[int, tuple] = {}

    def _weight(self, layer: nn.Linear) -> torch.Tensor:
        entry = self._packed.get(id(layer))
        if entry is None or entry[0] is not layer.weight:  # first use, or the layer's weight was replaced
            entry = (layer.weight, torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), None))
            self._packed[id(layer)] = entry
        return entry[1]

    def _small(self, x: torch.Tensor, layer: nn.Linear) -> bool:
        return x.numel() * layer.out_features < self.small_macs  # x: [T, in]

    def linear(self, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
        if self._small(x, layer):
            return super().linear(x, layer)
        return self._op(x, self._weight(layer), layer.bias, "none", [], "")

    def linear_act(self, x: torch.Tensor, layer: nn.Linear, activation: str) -> torch.Tensor:
        if self._small(x, layer) or activation not in _ONEDNN_ACT:
            return super().linear_act(x, layer, activation)
        attr, algorithm = _ONEDNN_ACT[activation]
        return self._op(x, self._weight(layer), layer.bias, attr, [], algorithm)

    def gated(self, x: torch.Tensor, layer: nn.Linear, activation: str) -> torch.Tensor:
        # two GEMMs, the activation fused into the gate's and the product into the up projection's:
        # no [T, 2 * intermediate] intermediate and no separate activation and multiply passes
        if self._small(x, layer):
            return super().gated(x, layer, activation)
        entry = self._halves.get(id(layer))
        if entry is None or entry[0] is not layer.weight:
            w = layer.weight.detach()
            n = w.shape[0] // 2
            b = (
                (None, None)
                if layer.bias is None
                else (layer.bias.detach()[:n].contiguous(), layer.bias.detach()[n:].contiguous())
            )
            entry = (
                layer.weight,
                *(torch.ops.mkldnn._reorder_linear_weight(h.contiguous(), None) for h in (w[:n], w[n:])),
                *b,
            )
            self._halves[id(layer)] = entry
        _, gate_w, up_w, gate_b, up_b = entry
        attr, algorithm = _ONEDNN_ACT[activation]
        gate = self._op(x, gate_w, gate_b, attr, [], algorithm)
        return self._op.binary(x, gate, up_w, up_b, "mul")

    def linear_add(self, x: torch.Tensor, layer: nn.Linear, residual: torch.Tensor) -> torch.Tensor:
        if self._small(x, layer):
            return super().linear_add(x, layer, residual)
        return self._op.binary(x, residual, self._weight(layer), layer.bias, "add")


def select_linear_ops(device: torch.device, dtype: torch.dtype) -> LinearOps:
    if (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and (dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()))
    ):
        try:
            # the check's shapes are small: its instance takes the fused kernels at every size
            _self_check(OneDnnLinearOps(small_macs=0), dtype)
            return OneDnnLinearOps()
        except Exception as exc:  # the kernels are internal to PyTorch: any failure means "not here"
            log.info("oneDNN fused linear unavailable (%s); using F.linear", exc)
    return LinearOps()


def _self_check(ops: LinearOps, dtype: torch.dtype = torch.float32) -> None:
    """The fused kernels must agree with the plain ones before they are trusted."""
    gen = torch.Generator().manual_seed(0)
    x, r = torch.randn(5, 16, generator=gen).to(dtype), torch.randn(5, 8, generator=gen).to(dtype)
    atol = 1e-5 if dtype == torch.float32 else 5e-2  # bf16 keeps 8 bits of mantissa
    plain = LinearOps()
    checks = []
    for layer in (nn.Linear(16, 8).to(dtype), nn.Linear(16, 8, bias=False).to(dtype)):  # bias-free: decoders
        checks += [
            (ops.linear(x, layer), plain.linear(x, layer)),
            (ops.linear_act(x, layer, "gelu"), plain.linear_act(x, layer, "gelu")),
            (ops.linear_add(x, layer, r), plain.linear_add(x, layer, r)),
            (ops.gated(x, layer, "silu"), plain.gated(x, layer, "silu")),
            (ops.gated(x, layer, "gelu_pytorch_tanh"), plain.gated(x, layer, "gelu_pytorch_tanh")),
        ]
    for got, want in checks:
        if got.dtype != want.dtype or not torch.allclose(got.float(), want.float(), atol=atol):
            raise ValueError("fused linear disagrees with F.linear")
