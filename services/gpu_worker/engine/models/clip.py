"""CLIP (openai/clip-vit-*): a text tower and a vision tower projected into one space.

The text tower is the engine's model: packed token rows, causal attention, pre-norm layers with
quick-GELU, a final norm, pooled at the end-of-text token (the last of each row: the tokenizer puts
it there and truncation keeps it), then ``text_projection``. The vision tower (``VisionTower``) is a
submodule of it, so the loader fills both from the one checkpoint and replicas share both: a ViT over
fixed-size images (every image the same number of patches, so a batch is a plain [N, patches + 1]
block and needs no packing), pooled at its class token, then ``visual_projection``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from embedfleet.services.gpu_worker.engine.attention import AttnMask
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
from embedfleet.shared.model_dir import families

# CLIPTextConfig's and CLIPVisionConfig's defaults (ViT-B/32): a saved config may leave any of them out
_TEXT = {
    "vocab_size": 49408,
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_hidden_layers": 12,
    "num_attention_heads": 8,
    "max_position_embeddings": 77,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
}
_VISION = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 32,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
}


def spec(config: dict[str, Any]) -> ModelSpec:
    """The text tower's spec (the engine's token path); the vision tower reads ``config`` itself."""
    text = tower(config, "text_config", _TEXT)
    return ModelSpec(
        model_type="clip",
        family=families.CLIP.name,
        hidden_size=int(text["hidden_size"]),
        num_heads=int(text["num_attention_heads"]),
        num_layers=int(text["num_hidden_layers"]),
        intermediate_size=int(text["intermediate_size"]),
        vocab_size=int(text["vocab_size"]),
        max_positions=int(text["max_position_embeddings"]),
        layer_norm_eps=float(text["layer_norm_eps"]),
        activation=str(text["hidden_act"]),
        causal=True,
        projection_dim=int(config.get("projection_dim", 512)),
        config=config,
    )


class VisionTower(nn.Module):
    """Images [N, 3, size, size] (normalised) -> vectors [N, projection_dim] float32."""

    def __init__(self, config: dict[str, Any], projection_dim: int) -> None:
        super().__init__()
        vision = tower(config, "vision_config", _VISION)
        h, self.patch = int(vision["hidden_size"]), int(vision["patch_size"])
        self.channels, self.image_size = int(vision["num_channels"]), int(vision["image_size"])
        self.patches = (self.image_size // self.patch) ** 2
        self.heads = int(vision["num_attention_heads"])
        # the patch embedding is a convolution with stride = kernel: a GEMM over the flattened patches
        self.patch_embed = nn.Linear(self.channels * self.patch * self.patch, h, bias=False)
        self.cls = nn.Parameter(torch.zeros(h))
        self.position = nn.Embedding(self.patches + 1, h)
        self.pre_norm = nn.LayerNorm(h, eps=float(vision["layer_norm_eps"]))
        self.layers = layers_of(vision)
        self.post_norm = nn.LayerNorm(h, eps=float(vision["layer_norm_eps"]))
        self.projection = nn.Linear(h, projection_dim, bias=False)

    def forward(self, pixels: torch.Tensor, ops: LinearOps) -> torch.Tensor:
        # pixels: [N, C, S, S] in the model's dtype, S = image_size
        n = pixels.shape[0]
        x = ops.linear(patches(pixels, self.patch), self.patch_embed).view(n, self.patches, -1)
        x = torch.cat([self.cls.expand(n, 1, -1), x], dim=1) + self.position.weight  # [N, L, hidden]
        length, hidden = x.shape[1], x.shape[2]
        x = self.pre_norm(x).reshape(n * length, hidden)
        attend = image_attention(n, length, self.heads)
        for layer in self.layers:
            x = layer(x, attend, ops)
        first = self.post_norm(x.view(n, length, hidden)[:, 0])  # [N, hidden]: the class token
        return ops.linear(first, self.projection).float()

    @staticmethod
    def hf_names(layers: int) -> dict[str, list[str]]:
        names = {
            "vision.patch_embed.weight": ["vision_model.embeddings.patch_embedding.weight"],
            "vision.cls": ["vision_model.embeddings.class_embedding"],
            "vision.position.weight": ["vision_model.embeddings.position_embedding.weight"],
            "vision.projection.weight": ["visual_projection.weight"],
        }
        for kind in ("weight", "bias"):
            names[f"vision.pre_norm.{kind}"] = [f"vision_model.pre_layrnorm.{kind}"]
            names[f"vision.post_norm.{kind}"] = [f"vision_model.post_layernorm.{kind}"]
        for i in range(layers):
            names.update(Layer.hf_names(f"vision_model.encoder.layers.{i}.", f"vision.layers.{i}."))
        return names


class ClipModel(TextTower):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec, tower(spec.config, "text_config", _TEXT), AttnMask(causal=True))
        self.projection = nn.Linear(spec.hidden_size, spec.projection_dim, bias=False)
        self.vision = VisionTower(spec.config, spec.projection_dim)

    def project(self, pooled: torch.Tensor) -> torch.Tensor:
        # [R, hidden] float32 (each row's end-of-text token) -> [R, projection_dim]
        return F.linear(pooled, self.projection.weight.float())

    def weight_names(self) -> dict[str, list[str]]:
        layers = int(tower(self.spec.config, "vision_config", _VISION)["num_hidden_layers"])
        return self.text_names() | {"projection.weight": ["text_projection.weight"]} | VisionTower.hf_names(layers)
