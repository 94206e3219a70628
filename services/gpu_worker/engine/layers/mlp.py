"""Gated MLPs (SwiGLU, GeGLU): act(gate(x)) * up(x), then down — the gate and up projections fused
into one GEMM whose output holds [gate | up]."""

from __future__ import annotations

import torch
from torch import nn

from services.gpu_worker.engine.linear import LinearOps, activation


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str, bias: bool = False) -> None:
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * intermediate, bias=bias)  # [gate; up] rows
        self.down = nn.Linear(intermediate, hidden, bias=bias)
        self.act = activation(act)

    def forward(self, x: torch.Tensor, ops: LinearOps, residual: torch.Tensor | None = None) -> torch.Tensor:
        # x: [T, hidden] -> [T, hidden] (+ residual, fused into the down projection where it can be)
        gate, up = ops.linear(x, self.gate_up).chunk(2, dim=-1)
        h = self.act(gate) * up
        return ops.linear(h, self.down) if residual is None else ops.linear_add(h, self.down, residual)
