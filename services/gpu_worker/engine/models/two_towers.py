"""The text tower the two-tower families (CLIP, SigLIP) share: token and position embeddings, pre-norm
layers (layers/vit.py), a final norm; each family adds its mask, its projection of the pooled vector
(``project``) and its image tower (``vision``), and names its checkpoint's tensors past the shared ones."""

from __future__ import annotations

import abc
from typing import Any

import torch
from torch import nn

from embedfleet.services.gpu_worker.engine.attention import Attention, AttnMask
from embedfleet.services.gpu_worker.engine.layers.vit import Layer, conv_as_linear, layers_of
from embedfleet.services.gpu_worker.engine.linear import LinearOps
from embedfleet.services.gpu_worker.engine.models.base import EncoderModel
from embedfleet.services.gpu_worker.engine.spec import ModelSpec


class TextTower(EncoderModel, abc.ABC):
    PREFIXES = ("",)
    PROBE = "text_model.embeddings.token_embedding.weight"

    def __init__(self, spec: ModelSpec, text: dict[str, Any], mask: AttnMask) -> None:
        """``text``: the text_config, its class defaults filled."""
        super().__init__(spec)
        h = spec.hidden_size
        self.token = nn.Embedding(spec.vocab_size, h)
        self.position = nn.Embedding(spec.max_positions, h)
        self.layers = layers_of(text)
        self.final_norm = nn.LayerNorm(h, eps=spec.layer_norm_eps)
        self.mask = mask

    def forward(self, batch, attention: Attention, ops: LinearOps) -> torch.Tensor:
        # batch.input_ids, .positions: [T] -> [T, hidden]
        x = self.token(batch.input_ids) + self.position(batch.positions)
        for layer in self.layers:
            x = layer(x, lambda q, k, v: attention(q, k, v, self.mask), ops)
        return self.final_norm(x)

    @abc.abstractmethod
    def project(self, pooled: torch.Tensor) -> torch.Tensor: ...

    def layer_masks(self) -> list[AttnMask]:
        return [self.mask] * self.spec.num_layers

    def score(self, hidden: torch.Tensor, batch) -> torch.Tensor:
        raise AssertionError(f"{self.spec.family} has no classification head")

    def text_names(self) -> dict[str, list[str]]:
        """The shared text tower's checkpoint names; a family adds its projection's and its image tower's."""
        names = {
            "token.weight": ["text_model.embeddings.token_embedding.weight"],
            "position.weight": ["text_model.embeddings.position_embedding.weight"],
        }
        for kind in ("weight", "bias"):
            names[f"final_norm.{kind}"] = [f"text_model.final_layer_norm.{kind}"]
        for i in range(self.spec.num_layers):
            names.update(Layer.hf_names(f"text_model.encoder.layers.{i}.", f"layers.{i}."))
        return names

    def weight_tensor(self, ours: str, tensor: torch.Tensor) -> torch.Tensor:
        if ours == "vision.patch_embed.weight":
            return conv_as_linear(tensor)
        return tensor
