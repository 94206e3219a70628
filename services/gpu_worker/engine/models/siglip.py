"""SigLIP (google/siglip-*, and SigLIP 2's fixed-resolution checkpoints, saved as ``siglip``): a text
tower and a vision tower into one space, trained with a sigmoid loss.

Text: bidirectional pre-norm layers over rows the tokenizer pads to the tower's 64 positions (the model
was trained on padded text, unmasked: its vectors change if the padding does), a final norm, the last
position pooled, then ``head``. Images: patches (a convolution with a bias) plus positions, no class
token, pre-norm layers, a post norm, then a multi-head attention pooling head: one learnt probe attends
over the patches, then a residual MLP. The layers are CLIP's (layers/vit.py: the same checkpoint names).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from embedfleet.services.gpu_worker.engine.attention import FULL
from embedfleet.services.gpu_worker.engine.layers.vit import (
    Layer,
    image_attention,
    layers_of,
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
