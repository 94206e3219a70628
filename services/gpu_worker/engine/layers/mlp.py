"""Gated MLPs (SwiGLU, GeGLU): act(gate(x)) * up(x), then down — the gate and up projections fused
into one weight whose rows hold [gate; up] (``LinearOps.gated`` runs it as the device does best)."""

from __future__ import annotations

import torch
from torch import nn

from embedfleet.services.gpu_worker.engine.linear import LinearOps, activation


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str, bias: bool = False) -> None:
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * intermediate, bias=bias)  # [gate; up] rows
        self.down = nn.Linear(intermediate, hidden, bias=bias)
        activation(act)  # an unknown activation fails at build, not at the first batch
        self.act = act

    def forward(self, x: torch.Tensor, ops: LinearOps, residual: torch.Tensor | None = None) -> torch.Tensor:
        # x: [T, hidden] -> [T, hidden] (+ residual, fused into the down projection where it can be)
        h = ops.gated(x, self.gate_up, self.act)
        return ops.linear(h, self.down) if residual is None else ops.linear_add(h, self.down, residual)
