"""The post-norm block of the rotary BERT descendants (GTE, NomicBERT): attention with rotary positions
+ residual, LayerNorm; gated MLP + residual, LayerNorm. Fused QKV rows [q; k; v], a bias where the
family has one."""

from __future__ import annotations

import torch
from torch import nn

from embedfleet.services.gpu_worker.engine.attention import FULL, Attention
from embedfleet.services.gpu_worker.engine.layers.mlp import GatedMLP
from embedfleet.services.gpu_worker.engine.layers.rotary import apply_rotary
from embedfleet.services.gpu_worker.engine.linear import LinearOps
from embedfleet.services.gpu_worker.engine.spec import ModelSpec


class RotaryPostNormBlock(nn.Module):
    def __init__(self, spec: ModelSpec, *, attention_bias: bool, down_bias: bool) -> None:
        super().__init__()
        h, eps = spec.hidden_size, spec.layer_norm_eps
        self.heads, self.head_dim = spec.num_heads, spec.head_dim
        self.qkv = nn.Linear(h, 3 * h, bias=attention_bias)
        self.attn_out = nn.Linear(h, h, bias=attention_bias)
        self.attn_norm = nn.LayerNorm(h, eps=eps)
        self.mlp = GatedMLP(h, spec.intermediate_size, spec.activation)
        if down_bias:  # GTE: the down projection alone has a bias
            self.mlp.down = nn.Linear(spec.intermediate_size, h)
        self.mlp_norm = nn.LayerNorm(h, eps=eps)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], attention: Attention, ops: LinearOps
    ) -> torch.Tensor:
        # x: [T, hidden]
        t = x.shape[0]
        q, k, v = ops.linear(x, self.qkv).view(t, 3, self.heads, self.head_dim).unbind(1)  # each [T, heads, d]
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        x = self.attn_norm(ops.linear_add(attention(q, k, v, FULL).reshape(t, -1), self.attn_out, x))
        return self.mlp_norm(self.mlp(x, ops, residual=x))
