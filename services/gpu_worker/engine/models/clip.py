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

from embedfleet.services.gpu_worker.engine.attention import Attention, AttnMask
from embedfleet.services.gpu_worker.engine.linear import LinearOps
from embedfleet.services.gpu_worker.engine.models.base import EncoderModel
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


def tower(config: dict[str, Any], name: str) -> dict[str, Any]:
    """``text_config`` or ``vision_config`` with the class defaults for what it leaves out."""
    return {**(_TEXT if name == "text_config" else _VISION), **(config.get(name) or {})}


def spec(config: dict[str, Any]) -> ModelSpec:
    """The text tower's spec (the engine's token path); the vision tower reads ``config`` itself."""
    text = tower(config, "text_config")
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

    def forward(self, x: torch.Tensor, attend, ops: LinearOps) -> torch.Tensor:
        # x: [T, hidden]; attend(q, k, v) with each [T, heads, d] -> [T, heads, d]
        t = x.shape[0]
        q, k, v = ops.linear(self.norm1(x), self.qkv).view(t, 3, self.heads, self.head_dim).unbind(1)
        x = ops.linear_add(attend(q, k, v).reshape(t, -1), self.out, x)
        return ops.linear_add(ops.linear_act(self.norm2(x), self.fc1, self.activation), self.fc2, x)

    @staticmethod
    def hf_names(hf: str, ours: str) -> dict[str, list[str]]:
        names = {}
        for kind in ("weight", "bias"):
            names[f"{ours}qkv.{kind}"] = [f"{hf}self_attn.{p}_proj.{kind}" for p in "qkv"]
            names[f"{ours}out.{kind}"] = [f"{hf}self_attn.out_proj.{kind}"]
            for norm in ("norm1", "norm2"):
                names[f"{ours}{norm}.{kind}"] = [f"{hf}layer_{norm}.{kind}"]
            for fc in ("fc1", "fc2"):
                names[f"{ours}{fc}.{kind}"] = [f"{hf}mlp.{fc}.{kind}"]
        return names


def _layers(config: dict[str, Any]) -> nn.ModuleList:
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


class VisionTower(nn.Module):
    """Images [N, 3, size, size] (normalised) -> vectors [N, projection_dim] float32."""

    def __init__(self, config: dict[str, Any], projection_dim: int) -> None:
        super().__init__()
        vision = tower(config, "vision_config")
        h, self.patch = int(vision["hidden_size"]), int(vision["patch_size"])
        self.channels, self.image_size = int(vision["num_channels"]), int(vision["image_size"])
        self.patches = (self.image_size // self.patch) ** 2
        self.heads = int(vision["num_attention_heads"])
        # the patch embedding is a convolution with stride = kernel: a GEMM over the flattened patches
        self.patch_embed = nn.Linear(self.channels * self.patch * self.patch, h, bias=False)
        self.cls = nn.Parameter(torch.zeros(h))
        self.position = nn.Embedding(self.patches + 1, h)
        self.pre_norm = nn.LayerNorm(h, eps=float(vision["layer_norm_eps"]))
        self.layers = _layers(vision)
        self.post_norm = nn.LayerNorm(h, eps=float(vision["layer_norm_eps"]))
        self.projection = nn.Linear(h, projection_dim, bias=False)

    def forward(self, pixels: torch.Tensor, ops: LinearOps) -> torch.Tensor:
        # pixels: [N, C, S, S] in the model's dtype, S = image_size
        n, c, s, p = pixels.shape[0], self.channels, self.image_size, self.patch
        g = s // p
        # [N, C, g, p, g, p] -> [N, g, g, C, p, p]: patches row by row, each flattened as the conv's weight is
        patches = pixels.reshape(n, c, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(n * g * g, c * p * p)
        x = ops.linear(patches, self.patch_embed).view(n, g * g, -1)
        x = torch.cat([self.cls.expand(n, 1, -1), x], dim=1) + self.position.weight  # [N, L, hidden]
        length, hidden = x.shape[1], x.shape[2]
        x = self.pre_norm(x).reshape(n * length, hidden)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            # [N * L, heads, d] each: every image attends over its own L tokens, no mask
            q, k, v = (t.view(n, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
            return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n * length, self.heads, -1)

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


class ClipModel(EncoderModel):
    PREFIXES = ("",)
    PROBE = "text_model.embeddings.token_embedding.weight"

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        h = spec.hidden_size
        self.token = nn.Embedding(spec.vocab_size, h)
        self.position = nn.Embedding(spec.max_positions, h)
        self.layers = _layers(tower(spec.config, "text_config"))
        self.final_norm = nn.LayerNorm(h, eps=spec.layer_norm_eps)
        self.projection = nn.Linear(h, spec.projection_dim, bias=False)
        self.mask = AttnMask(causal=True)
        self.vision = VisionTower(spec.config, spec.projection_dim)

    def forward(self, batch, attention: Attention, ops: LinearOps) -> torch.Tensor:
        # batch.input_ids, .positions: [T] -> [T, hidden]
        x = self.token(batch.input_ids) + self.position(batch.positions)
        for layer in self.layers:
            x = layer(x, lambda q, k, v: attention(q, k, v, self.mask), ops)
        return self.final_norm(x)

    def project(self, pooled: torch.Tensor) -> torch.Tensor:
        # [R, hidden] float32 -> [R, projection_dim]
        return F.linear(pooled, self.projection.weight.float())

    def layer_masks(self) -> list[AttnMask]:
        return [self.mask] * self.spec.num_layers

    def score(self, hidden: torch.Tensor, batch) -> torch.Tensor:
        raise AssertionError("CLIP has no classification head")

    def weight_names(self) -> dict[str, list[str]]:
        names = {
            "token.weight": ["text_model.embeddings.token_embedding.weight"],
            "position.weight": ["text_model.embeddings.position_embedding.weight"],
            "final_norm.weight": ["text_model.final_layer_norm.weight"],
            "final_norm.bias": ["text_model.final_layer_norm.bias"],
            "projection.weight": ["text_projection.weight"],
        }
        for i in range(self.spec.num_layers):
            names.update(Layer.hf_names(f"text_model.encoder.layers.{i}.", f"layers.{i}."))
        return names | VisionTower.hf_names(int(tower(self.spec.config, "vision_config")["num_hidden_layers"]))

    def weight_tensor(self, ours: str, tensor: torch.Tensor) -> torch.Tensor:
        if ours == "vision.patch_embed.weight":  # [hidden, C, p, p] conv kernel -> [hidden, C * p * p]
            return tensor.reshape(tensor.shape[0], -1)
        return tensor
