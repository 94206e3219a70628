"""What the two-tower families' towers share: the pre-norm block (CLIP's and SigLIP's, one checkpoint
layout), a tower's config with its class defaults, and the image side's patches and attention over a
batch of equal-length images (every image the same number of patches: a plain [N, L] block, no packing)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from embedfleet.services.gpu_worker.engine.linear import LinearOps

# attend(q, k, v): each [T, heads, d] -> [T, heads, d]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def tower(config: dict[str, Any], name: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """``config[name]`` (text_config, vision_config) with the class ``defaults`` for what it leaves out."""
    return {**defaults, **(config.get(name) or {})}


class Layer(nn.Module):
    """Pre-norm block: x + attn(norm1(x)), then x + fc2(act(fc1(norm2(x)))), on flat [T, hidden] tokens."""

    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float, activation: str) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.norm1 = nn.LayerNorm(hidden, eps=eps)
        self.qkv = nn.Linear(hidden, 3 * hidden)  # query, key, value fused into one GEMM
        self.out = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=eps)
        self.fc1 = nn.Linear(hidden, intermediate)
        self.fc2 = nn.Linear(intermediate, hidden)
        self.activation = activation

    def forward(self, x: torch.Tensor, attend: Attend, ops: LinearOps) -> torch.Tensor:
        # x: [T, hidden]
        t = x.shape[0]
        q, k, v = ops.linear(self.norm1(x), self.qkv).view(t, 3, self.heads, self.head_dim).unbind(1)
        x = ops.linear_add(attend(q, k, v).reshape(t, -1), self.out, x)
        return ops.linear_add(ops.linear_act(self.norm2(x), self.fc1, self.activation), self.fc2, x)

    @staticmethod
    def hf_names(hf: str, ours: str) -> dict[str, list[str]]:
        """Checkpoint names under ``hf`` ("text_model.encoder.layers.3.") of our parameters under ``ours``."""
        names = {}
        for kind in ("weight", "bias"):
            names[f"{ours}qkv.{kind}"] = [f"{hf}self_attn.{p}_proj.{kind}" for p in "qkv"]
            names[f"{ours}out.{kind}"] = [f"{hf}self_attn.out_proj.{kind}"]
            for norm in ("norm1", "norm2"):
                names[f"{ours}{norm}.{kind}"] = [f"{hf}layer_{norm}.{kind}"]
            for fc in ("fc1", "fc2"):
                names[f"{ours}{fc}.{kind}"] = [f"{hf}mlp.{fc}.{kind}"]
        return names


def layers_of(config: dict[str, Any]) -> nn.ModuleList:
    """A tower's pre-norm layers, as its config (text_config, vision_config, defaults filled) sizes them."""
    h = int(config["hidden_size"])
    return nn.ModuleList(
        Layer(
            h,
            int(config["num_attention_heads"]),
            int(config["intermediate_size"]),
            float(config["layer_norm_eps"]),
            str(config["hidden_act"]),
        )
        for _ in range(int(config["num_hidden_layers"]))
    )


def patches(pixels: torch.Tensor, patch: int) -> torch.Tensor:
    """[N, C, S, S] -> [N * g * g, C * patch * patch] (g = S / patch): each patch flattened as a stride-patch
    convolution's kernel is ([C, p, p]), the patches of an image row by row."""
    n, c, s, _ = pixels.shape
    g = s // patch
    return pixels.reshape(n, c, g, patch, g, patch).permute(0, 2, 4, 1, 3, 5).reshape(n * g * g, c * patch * patch)


def image_attention(images: int, length: int, heads: int) -> Attend:
    """Attention over a batch of ``images`` of ``length`` tokens each: every image over its own tokens, unmasked."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.view(images, length, heads, -1).transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(images * length, heads, -1)

    return attend


def packed_image_attention(lengths: list[int]) -> Attend:
    """Attention over images of ``lengths`` tokens packed back to back ([sum(lengths), heads, d]): every
    image over its own tokens, unmasked."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = []
        for qi, ki, vi in zip(*(t.split(lengths) for t in (q, k, v))):
            qi, ki, vi = (t.transpose(0, 1)[None] for t in (qi, ki, vi))  # [1, heads, L, d]
            out.append(F.scaled_dot_product_attention(qi, ki, vi)[0].transpose(0, 1))
        return torch.cat(out)

    return attend


def conv_as_linear(tensor: torch.Tensor) -> torch.Tensor:
    """A patch embedding's [hidden, C, p, p] kernel as the [hidden, C * p * p] weight of its GEMM."""
    return tensor.reshape(tensor.shape[0], -1)
