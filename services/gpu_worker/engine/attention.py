"""Non-causal attention over packed variable-length sequences (no padding)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class SdpaVarlen:
    """PyTorch SDPA, one call per sequence: works on every device and head size.

    Built once per batch (the host-side sequence bounds are shared by all layers).
    """

    def __init__(self, cu_seqlens: list[int]) -> None:
        self.bounds = list(zip(cu_seqlens[:-1], cu_seqlens[1:]))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q, k, v: [T, heads, head_dim] -> [T, heads, head_dim]
        out = torch.empty_like(q)
        for start, end in self.bounds:
            # [L, heads, d] -> [1, heads, L, d]: 4-D inputs take the fused (flash) kernel on CPU,
            # 3-D ones fall back to the unfused math path (several times slower)
            o = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1)[None], k[start:end].transpose(0, 1)[None], v[start:end].transpose(0, 1)[None]
            )
            out[start:end] = o[0].transpose(0, 1)
        return out
