"""Rotary position embeddings (RoPE) over packed tokens, from a config's rope parameters.

Positions come from the packed batch (index within each sequence), so cos/sin are computed on the
device from the positions tensor: no host loop per sequence, and the same graph fits every batch.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from embedfleet.shared.config.option import ConfigError

ROPE_TYPES = ("default", "linear", "llama3")


def rope_parameters(
    config: dict[str, Any],
    layer_type: str | None = None,
    *,
    theta_key: str = "rope_theta",
    default_theta: float = 10000.0,
    scaling: bool = True,
) -> dict[str, Any]:
    """This layer type's rope parameters, from either config format: transformers 5's
    ``rope_parameters`` (flat, or keyed by layer type), or 4's ``rope_theta`` + ``rope_scaling``."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and layer_type is not None and isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    if isinstance(params, dict) and "rope_theta" in params:
        out = dict(params)
    else:
        out = dict(config.get("rope_scaling") or {}) if scaling else {}
        out["rope_theta"] = float(config.get(theta_key) or default_theta)
    out["rope_type"] = out.get("rope_type") or out.get("type") or "default"
    return out


def inv_frequencies(params: dict[str, Any], head_dim: int) -> torch.Tensor:
    """[head_dim / 2] float32 inverse frequencies for the rope type (default, linear, llama3)."""
    kind = params["rope_type"]
    if kind not in ROPE_TYPES:
        raise ConfigError(f"rope type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ConfigError("partial_rotary_factor != 1 is not supported")
    base = float(params["rope_theta"])
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if kind == "linear":
        return inv / float(params["factor"])
    if kind == "llama3":
        factor = float(params["factor"])
        low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
        old = float(params["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        return torch.where(medium, smoothed, scaled)
    return inv


class Rotary(nn.Module):
    """cos/sin tables [T, head_dim] for the tokens' positions (computed in float32)."""

    inv_freq: torch.Tensor  # [head_dim / 2] float32, a buffer (registered in __init__)

    def __init__(self, params: dict[str, Any], head_dim: int) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_frequencies(params, head_dim), persistent=False)

    def _apply(self, fn, recurse: bool = True):
        # the module may be cast to half precision: the frequencies stay float32 (only moved)
        inv_freq = self.inv_freq
        super()._apply(fn, recurse)
        self.inv_freq = inv_freq.to(self.inv_freq.device)
        return self

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [T] int -> cos, sin: [T, head_dim]
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, d] rotated by its token's angles (the rotate-half layout), in float32:
    x * cos + (-x2, x1) * sin, as one multiply and two in-place multiply-adds (no concatenation)."""
    x32 = x.float()
    half = x32.shape[-1] // 2
    s = sin[:, None, :half]  # the table repeats its angles in both halves
    out = x32 * cos[:, None]
    out[..., :half].addcmul_(x32[..., half:], s, value=-1.0)
    out[..., half:].addcmul_(x32[..., :half], s)
    return out.to(x.dtype)
