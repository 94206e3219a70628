"""Grouped-query self-attention with rotary positions and optional per-head q/k norms (the decoder
families and Gemma3): one fused QKV GEMM, rope on q and k, the attention backend, the output GEMM."""

from __future__ import annotations

import torch
from torch import nn

from embedfleet.services.gpu_worker.engine.attention import Attention, AttnMask
from embedfleet.services.gpu_worker.engine.layers.norms import RMSNorm
from embedfleet.services.gpu_worker.engine.layers.rotary import apply_rotary
from embedfleet.services.gpu_worker.engine.linear import LinearOps


class SelfAttention(nn.Module):
    def __init__(
        self,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        *,
        qkv_bias: bool = False,
        out_bias: bool = False,
        qk_norm_eps: float | None = None,
        norm_offset: bool = False,
    ) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.qkv = nn.Linear(hidden, (heads + 2 * kv_heads) * head_dim, bias=qkv_bias)  # [q; k; v] rows
        self.out = nn.Linear(heads * head_dim, hidden, bias=out_bias)
        self.q_norm = self.k_norm = None
        if qk_norm_eps is not None:  # Qwen3, Gemma3: RMSNorm over each head's vector
            self.q_norm = RMSNorm(head_dim, qk_norm_eps, norm_offset)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps, norm_offset)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: AttnMask,
        attention: Attention,
        ops: LinearOps,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # x: [T, hidden] -> [T, hidden] (+ residual, fused into the output GEMM)
        t, d = x.shape[0], self.head_dim
        qkv = ops.linear(x, self.qkv)
        q = qkv[:, : self.heads * d].view(t, self.heads, d)
        k = qkv[:, self.heads * d : (self.heads + self.kv_heads) * d].view(t, self.kv_heads, d)
        v = qkv[:, (self.heads + self.kv_heads) * d :].view(t, self.kv_heads, d)
        if self.q_norm is not None and self.k_norm is not None:  # both, or neither
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        a = attention(q, k, v, mask).reshape(t, -1)
        return ops.linear(a, self.out) if residual is None else ops.linear_add(a, self.out, residual)

    @staticmethod
    def hf_names(hf: str, ours: str, qkv_bias: bool, out_bias: bool, qk_norm: bool) -> dict[str, list[str]]:
        """Checkpoint names under ``hf`` (e.g. "layers.3.self_attn.") for our parameters under ``ours``."""
        names = {
            f"{ours}qkv.weight": [f"{hf}{p}_proj.weight" for p in "qkv"],
            f"{ours}out.weight": [f"{hf}o_proj.weight"],
        }
        if qkv_bias:
            names[f"{ours}qkv.bias"] = [f"{hf}{p}_proj.bias" for p in "qkv"]
        if out_bias:
            names[f"{ours}out.bias"] = [f"{hf}o_proj.bias"]
        if qk_norm:
            names[f"{ours}q_norm.weight"] = [f"{hf}q_norm.weight"]
            names[f"{ours}k_norm.weight"] = [f"{hf}k_norm.weight"]
        return names
