"""SigLIP (google/siglip-*, and SigLIP 2's fixed-resolution checkpoints, saved as ``siglip``) and SigLIP 2
NaFlex (``siglip2``: google/siglip2-*-naflex): a text tower and a vision tower into one space, trained
with a sigmoid loss.

Text: bidirectional pre-norm layers over rows the tokenizer pads to the tower's 64 positions (the model
was trained on padded text, unmasked: its vectors change if the padding does), a final norm, the last
position pooled, then ``head``. Images: patches (a convolution with a bias) plus positions, no class
token, pre-norm layers, a post norm, then a multi-head attention pooling head: one learnt probe attends
over the patches, then a residual MLP. The layers are CLIP's (layers/vit.py: the same checkpoint names).

NaFlex: each image comes at its own grid of gh x gw patches (shared/images/naflex.py), as patch rows
(p, p, C) that a linear layer embeds; the learnt positions, a square grid, are resized to gh x gw as
transformers resizes them (bilinear with antialiasing, its weights written out in float32), and every
image attends over its own patches, the probe of the pooling head too: transformers pads images to
max_num_patches and masks the padding, the same arithmetic for the real patches.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from embedfleet.services.gpu_worker.engine.attention import FULL
from embedfleet.services.gpu_worker.engine.layers.vit import (
    Layer,
    image_attention,
    layers_of,
    packed_image_attention,
    patches,
    tower,
)
from embedfleet.services.gpu_worker.engine.linear import LinearOps
from embedfleet.services.gpu_worker.engine.models.two_towers import TextTower
from embedfleet.services.gpu_worker.engine.spec import ModelSpec
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir import families

# SiglipTextConfig's and SiglipVisionConfig's defaults: a saved config may leave any of them out
_TEXT = {
    "vocab_size": 32000,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 64,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
# Siglip2VisionConfig's: no image_size, num_patches learnt positions (a square grid)
_NAFLEX = {"num_patches": 256}
_VISION = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}


def spec(config: dict[str, Any]) -> ModelSpec:
    """The text tower's spec (the engine's token path); the vision tower reads ``config`` itself."""
    text, vision = tower(config, "text_config", _TEXT), tower(config, "vision_config", _VISION)
    if vision.get("vision_use_head", True) is False:
        raise ConfigError("vision_config.vision_use_head is false: the image tower has no pooling head to serve")
    projection = int(text.get("projection_size") or text["hidden_size"])
    if projection != int(vision["hidden_size"]):
        raise ConfigError(
            f"the text tower's vectors ({projection}) and the image tower's ({vision['hidden_size']}) differ in size"
        )
    return ModelSpec(
        model_type="siglip",
        family=families.SIGLIP.name,
        hidden_size=int(text["hidden_size"]),
        num_heads=int(text["num_attention_heads"]),
        num_layers=int(text["num_hidden_layers"]),
        intermediate_size=int(text["intermediate_size"]),
        vocab_size=int(text["vocab_size"]),
        max_positions=int(text["max_position_embeddings"]),
        layer_norm_eps=float(text["layer_norm_eps"]),
        activation=str(text["hidden_act"]),
        projection_dim=projection,
        config=config,
    )


class PoolingHead(nn.Module):
    """Multi-head attention pooling: a learnt probe attends over an image's tokens, then x + mlp(norm(x))."""

    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float, activation: str) -> None:
        super().__init__()
        self.heads = heads
        self.probe = nn.Parameter(torch.zeros(hidden))
        self.qkv = nn.Linear(hidden, 3 * hidden)  # nn.MultiheadAttention's in_proj: [q; k; v] rows
        self.out = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.fc1 = nn.Linear(hidden, intermediate)
        self.fc2 = nn.Linear(intermediate, hidden)
        self.activation = activation

    def forward(self, x: torch.Tensor, ops: LinearOps) -> torch.Tensor:
        # x: [N, L, hidden] -> [N, hidden]
        n, length, hidden = x.shape
        w, b = self.qkv.weight, self.qkv.bias
        q = F.linear(self.probe, w[:hidden], b[:hidden]).view(1, self.heads, 1, -1).expand(n, -1, -1, -1)
        kv = F.linear(x.reshape(n * length, hidden), w[hidden:], b[hidden:]).view(n, length, 2, self.heads, -1)
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)  # each [N, heads, L, d]
        pooled = F.scaled_dot_product_attention(q, k, v).reshape(n, hidden)
        pooled = ops.linear(pooled, self.out)
        return ops.linear_add(ops.linear_act(self.norm(pooled), self.fc1, self.activation), self.fc2, pooled)


class VisionTower(nn.Module):
    """Images [N, 3, size, size] (normalised) -> vectors [N, hidden] float32."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        vision = tower(config, "vision_config", _VISION)
        h, self.patch = int(vision["hidden_size"]), int(vision["patch_size"])
        self.channels, self.image_size = int(vision["num_channels"]), int(vision["image_size"])
        self.naflex = config.get("model_type") == "siglip2"
        if self.naflex:  # positions on a square grid, resized to each image's
            self.patches = int(tower(config, "vision_config", _NAFLEX)["num_patches"])
            self.grid = math.isqrt(self.patches)
            if self.grid**2 != self.patches:
                raise ConfigError(f"vision_config.num_patches {self.patches} is not a square grid of positions")
        else:
            self.patches = (self.image_size // self.patch) ** 2
        self.heads = int(vision["num_attention_heads"])
        eps, act = float(vision["layer_norm_eps"]), str(vision["hidden_act"])
        self.patch_embed = nn.Linear(self.channels * self.patch * self.patch, h)  # the stride-p convolution
        self.position = nn.Embedding(self.patches, h)
        self.layers = layers_of(vision)
        self.post_norm = nn.LayerNorm(h, eps=eps)
        self.head = PoolingHead(h, self.heads, int(vision["intermediate_size"]), eps, act)

    def forward(self, pixels: torch.Tensor, ops: LinearOps) -> torch.Tensor:
        # pixels: [N, C, S, S] in the model's dtype
        n, length = pixels.shape[0], self.patches
        x = ops.linear(patches(pixels, self.patch), self.patch_embed).view(n, length, -1) + self.position.weight
        x = x.reshape(n * length, -1)
        attend = image_attention(n, length, self.heads)
        for layer in self.layers:
            x = layer(x, attend, ops)
        return self.head(self.post_norm(x).view(n, length, -1), ops).float()

    def forward_patches(self, values: torch.Tensor, grids: tuple[tuple[int, int], ...], ops: LinearOps) -> torch.Tensor:
        """NaFlex: patch rows [P, p * p * C] (normalised, the model's dtype; each image's gh * gw rows in
        turn) -> vectors [len(grids), hidden] float32."""
        lengths = [h * w for h, w in grids]
        x = ops.linear(values, self.patch_embed)
        x = x + torch.cat([self._positions(h, w) for h, w in grids]).to(x.dtype)
        attend = packed_image_attention(lengths)
        for layer in self.layers:
            x = layer(x, attend, ops)
        x = self.post_norm(x)
        return torch.cat([self.head(image[None], ops) for image in x.split(lengths)]).float()

    def _positions(self, height: int, width: int) -> torch.Tensor:
        """The learnt [grid, grid] positions resized to [height * width, hidden] float32, as transformers'
        ``resize_positional_embeddings`` (bilinear, antialiased: each output a weighted sum of the grid)."""
        table = self.position.weight.float().view(self.grid, self.grid, -1)
        rows, cols = _resize_weights(height, self.grid, table.device), _resize_weights(width, self.grid, table.device)
        return torch.einsum("hi,wj,ijd->hwd", rows, cols, table).reshape(height * width, -1)

    @staticmethod
    def hf_names(layers: int) -> dict[str, list[str]]:
        names = {
            "vision.patch_embed.weight": ["vision_model.embeddings.patch_embedding.weight"],
            "vision.patch_embed.bias": ["vision_model.embeddings.patch_embedding.bias"],
            "vision.position.weight": ["vision_model.embeddings.position_embedding.weight"],
            "vision.head.probe": ["vision_model.head.probe"],
            "vision.head.qkv.weight": ["vision_model.head.attention.in_proj_weight"],
            "vision.head.qkv.bias": ["vision_model.head.attention.in_proj_bias"],
        }
        for kind in ("weight", "bias"):
            names[f"vision.post_norm.{kind}"] = [f"vision_model.post_layernorm.{kind}"]
            names[f"vision.head.out.{kind}"] = [f"vision_model.head.attention.out_proj.{kind}"]
            names[f"vision.head.norm.{kind}"] = [f"vision_model.head.layernorm.{kind}"]
            names[f"vision.head.fc1.{kind}"] = [f"vision_model.head.mlp.fc1.{kind}"]
            names[f"vision.head.fc2.{kind}"] = [f"vision_model.head.mlp.fc2.{kind}"]
        for i in range(layers):
            names.update(Layer.hf_names(f"vision_model.encoder.layers.{i}.", f"vision.layers.{i}."))
        return names


def _resize_weights(size: int, grid: int, device: torch.device) -> torch.Tensor:
    """[size, grid] float32: F.interpolate's weights (bilinear, align_corners=False, antialias=True) of each
    output position along one axis, as transformers writes them out."""
    scale = grid / size
    support = max(scale, 1.0)
    center = (torch.arange(size, dtype=torch.float32, device=device) + 0.5) * scale - 0.5
    source = torch.arange(grid, dtype=torch.float32, device=device)
    weights = (1 - (source[None, :] - center[:, None]).abs() / support).clamp(min=0)
    return weights / weights.sum(-1, keepdim=True)


class SiglipModel(TextTower):
    def __init__(self, spec: ModelSpec) -> None:
        # bidirectional: every row is padded to the tower's positions, and the padding is attended, as trained
        super().__init__(spec, tower(spec.config, "text_config", _TEXT), FULL)
        self.text_head = nn.Linear(spec.hidden_size, spec.projection_dim)
        self.vision = VisionTower(spec.config)

    def project(self, pooled: torch.Tensor) -> torch.Tensor:
        # [R, hidden] float32 (the last position of each padded row) -> [R, projection]
        return F.linear(pooled, self.text_head.weight.float(), self.text_head.bias.float())

    def weight_names(self) -> dict[str, list[str]]:
        layers = int(tower(self.spec.config, "vision_config", _VISION)["num_hidden_layers"])
        head = {f"text_head.{kind}": [f"text_model.head.{kind}"] for kind in ("weight", "bias")}
        return self.text_names() | head | VisionTower.hf_names(layers)

    def weight_tensor(self, ours: str, tensor: torch.Tensor) -> torch.Tensor:
        if ours == "vision.head.probe":  # [1, 1, hidden]
            return tensor.reshape(-1)
        return super().weight_tensor(ours, tensor)
