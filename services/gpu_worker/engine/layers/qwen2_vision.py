"""Qwen2-VL's vision tower (transformers' ``Qwen2VisionTransformerPretrainedModel``), over the images of one
batch, each of its own size: patch rows in, one vector per image token (``merge`` x ``merge`` patches) out.

- Patches: the image processor cuts each image into ``patch``-pixel squares, ``temporal`` frames deep (a
  still image is its one frame repeated), and lays each out as a row [C * temporal * patch * patch]; the
  embedding is a Conv3d whose kernel is its stride, so a GEMM over the rows (``conv_as_linear``).
- Rows come in merge-window order: the (gh / m, gw / m) windows row by row, in each its m x m patches
  row by row. The merger relies on it (a window's m * m rows are one image token's), and so do the
  positions: each patch's (row, column) in its image, in that order.
- Positions are 2-D rotary: of each head's rotated pairs, the first half turn by the patch's row, the
  second by its column (``PatchRotary``).
- Blocks: CLIP's pre-norm block (layers/vit.py's ``Layer``: LayerNorm eps 1e-6, fused qkv with bias, the
  output projection, fc1 -> act -> fc2), attention bidirectional within each image only (an image never
  sees another's patches): SDPA image by image, the images' sizes known on the host.
- Merger: LayerNorm, each window's m * m patch vectors side by side [4 * embed], Linear, GELU, Linear
  to the language model's width.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from embedfleet.services.gpu_worker.engine.layers.rotary import Rotary, apply_rotary
from embedfleet.services.gpu_worker.engine.layers.vit import Attend, Layer, packed_image_attention
from embedfleet.services.gpu_worker.engine.linear import LinearOps, activation
from embedfleet.shared.config.option import ConfigError

_EPS = 1e-6  # the blocks' and the merger's LayerNorms (fixed in transformers, not in the config)


class PatchRotary(nn.Module):
    """cos/sin tables [P, head_dim] of patches at (row, column): angles [row * f, column * f] (f: head_dim / 4
    frequencies), the rotate-half layout's two halves alike, as ``apply_rotary`` takes them."""

    def __init__(self, theta: float, head_dim: int) -> None:
        super().__init__()
        # each axis turns a quarter of the head: the inverse frequencies of a rope half the head's width
        # (a Rotary keeps them float32 when the model is cast to half precision)
        self.axis = Rotary({"rope_type": "default", "rope_theta": theta}, head_dim // 2)

    def forward(self, rows: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # rows, cols: [P] int -> cos, sin: [P, head_dim]
        inv = self.axis.inv_freq.float()
        freqs = torch.cat([rows.float()[:, None] * inv, cols.float()[:, None] * inv], dim=-1)  # [P, head_dim / 2]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos(), emb.sin()


def patch_positions(grids: tuple[tuple[int, int], ...], merge: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Each patch's (row, column) in its image, [P] each, in the rows' merge-window order."""
    rows: list[torch.Tensor] = []
    cols: list[torch.Tensor] = []
    for gh, gw in grids:
        r = torch.arange(gh, device=device)[:, None].expand(gh, gw)
        c = torch.arange(gw, device=device)[None, :].expand(gh, gw)
        for grid, out in ((r, rows), (c, cols)):
            out.append(grid.reshape(gh // merge, merge, gw // merge, merge).transpose(1, 2).reshape(-1))
    return torch.cat(rows), torch.cat(cols)


def per_image_attention(lengths: list[int], rope: tuple[torch.Tensor, torch.Tensor]) -> Attend:
    """Attention over images of ``lengths`` patches packed back to back: q and k turned by their patch's
    angles, then every image over its own patches, unmasked."""
    within = packed_image_attention(lengths)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q, k, v: [P, heads, d] -> [P, heads, d]
        return within(apply_rotary(q, *rope), apply_rotary(k, *rope), v)

    return attend


class PatchMerger(nn.Module):
    """[P, embed] -> [P / m², hidden]: each merge window's m * m patch vectors (normed) side by side, then an MLP."""

    def __init__(self, embed: int, hidden: int, merge: int) -> None:
        super().__init__()
        self.wide = embed * merge * merge
        self.norm = nn.LayerNorm(embed, eps=_EPS)
        self.fc1 = nn.Linear(self.wide, self.wide)
        self.fc2 = nn.Linear(self.wide, hidden)

    def forward(self, x: torch.Tensor, ops: LinearOps) -> torch.Tensor:
        x = self.norm(x).reshape(-1, self.wide)
        return ops.linear(ops.linear_act(x, self.fc1, "gelu"), self.fc2)


class Qwen2VisionTower(nn.Module):
    """Patch rows [P, C * temporal * patch * patch] (rescaled, normalised, in the model's dtype) of images of
    (gh, gw) patches -> image-token vectors [P / merge², hidden], the images' tokens in order."""

    def __init__(self, vision: dict[str, Any], hidden: int) -> None:
        """``vision``: the vision_config, its class defaults filled (families.vlm_vision_config); ``hidden``:
        the language model's width, the merger's output."""
        super().__init__()
        embed, self.heads = int(vision["embed_dim"]), int(vision["num_heads"])
        self.merge = int(vision["spatial_merge_size"])
        patch, temporal, channels = (
            int(vision["patch_size"]),
            int(vision["temporal_patch_size"]),
            int(vision["in_channels"]),
        )
        if int(vision["hidden_size"]) != hidden:
            raise ConfigError(
                f"vision_config.hidden_size {vision['hidden_size']} (the merger's output) differs from the "
                f"language model's hidden_size {hidden}"
            )
        if embed % self.heads or (embed // self.heads) % 4:
            raise ConfigError(f"vision_config: embed_dim {embed} / num_heads {self.heads} is no multiple of 4")
        act = str(vision["hidden_act"])
        try:
            activation(act)
        except KeyError:
            raise ConfigError(f"vision_config.hidden_act {act!r} is not supported") from None
        self.row = channels * temporal * patch * patch
        self.patch_embed = nn.Linear(self.row, embed, bias=False)  # the Conv3d, kernel = stride
        self.rotary = PatchRotary(float(vision["rope_theta"]), embed // self.heads)
        self.layers = nn.ModuleList(
            Layer(embed, self.heads, int(embed * float(vision["mlp_ratio"])), _EPS, act)
            for _ in range(int(vision["depth"]))
        )
        self.merger = PatchMerger(embed, hidden, self.merge)

    def forward(self, patches: torch.Tensor, grids: tuple[tuple[int, int], ...], ops: LinearOps) -> torch.Tensor:
        # patches: [P, row]; grids: (gh, gw) per image, their patches in that order
        lengths = [gh * gw for gh, gw in grids]
        if any(gh % self.merge or gw % self.merge for gh, gw in grids):
            raise ValueError(f"an image's patch grid {list(grids)} is not in whole {self.merge}x{self.merge} windows")
        if patches.dim() != 2 or patches.shape[1] != self.row:
            raise ValueError(f"patch rows of shape {tuple(patches.shape)}; the vision tower takes [P, {self.row}]")
        if patches.shape[0] != sum(lengths):
            raise ValueError(f"{patches.shape[0]} patch rows for images of {sum(lengths)} patches ({list(grids)})")
        rope = self.rotary(*patch_positions(grids, self.merge, patches.device))
        attend = per_image_attention(lengths, rope)
        x = ops.linear(patches, self.patch_embed)  # [P, embed]
        for layer in self.layers:
            x = layer(x, attend, ops)
        return self.merger(x, ops)

    @staticmethod
    def hf_names(depth: int, hf: str, ours: str) -> dict[str, list[str]]:
        """Checkpoint names under ``hf`` ("visual.") of our parameters under ``ours``."""
        names = {
            f"{ours}patch_embed.weight": [f"{hf}patch_embed.proj.weight"],
            f"{ours}merger.norm.weight": [f"{hf}merger.ln_q.weight"],
            f"{ours}merger.norm.bias": [f"{hf}merger.ln_q.bias"],
        }
        for kind in ("weight", "bias"):
            names[f"{ours}merger.fc1.{kind}"] = [f"{hf}merger.mlp.0.{kind}"]
            names[f"{ours}merger.fc2.{kind}"] = [f"{hf}merger.mlp.2.{kind}"]
            for i in range(depth):
                block, layer = f"{hf}blocks.{i}.", f"{ours}layers.{i}."
                names[f"{layer}qkv.{kind}"] = [f"{block}attn.qkv.{kind}"]
                names[f"{layer}out.{kind}"] = [f"{block}attn.proj.{kind}"]
                for part in ("norm1", "norm2"):
                    names[f"{layer}{part}.{kind}"] = [f"{block}{part}.{kind}"]
                for part in ("fc1", "fc2"):
                    names[f"{layer}{part}.{kind}"] = [f"{block}mlp.{part}.{kind}"]
        return names
