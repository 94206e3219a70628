"""ModernBERT (gte-modernbert, modernbert-embed, ModernBERT rerankers): pre-norm blocks without
biases, rotary positions, GeGLU MLP, a final norm; attention is global every n-th layer and local
(a symmetric window of ``local_attention`` tokens) on the others, each kind with its own rope base."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from embedfleet.services.gpu_worker.engine.attention import Attention, AttnMask
from embedfleet.services.gpu_worker.engine.layers.mlp import GatedMLP
from embedfleet.services.gpu_worker.engine.layers.rotary import Rotary, apply_rotary, rope_parameters
from embedfleet.services.gpu_worker.engine.linear import LinearOps, activation
from embedfleet.services.gpu_worker.engine.models.base import EncoderModel
from embedfleet.services.gpu_worker.engine.pooling import pool
from embedfleet.services.gpu_worker.engine.spec import ModelSpec, num_labels

FULL, SLIDING = "full_attention", "sliding_attention"


def spec(config: dict[str, Any]) -> ModelSpec:
    return ModelSpec(
        model_type="modernbert",
        family="ModernBERT",
        hidden_size=int(config["hidden_size"]),
        num_heads=int(config["num_attention_heads"]),
        num_layers=int(config["num_hidden_layers"]),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        max_positions=int(config.get("max_position_embeddings", 8192)),
        layer_norm_eps=float(config.get("norm_eps", 1e-5)),
        activation=config.get("hidden_activation", "gelu"),
        num_labels=num_labels(config),
        config=config,
    )


def layer_types(config: dict[str, Any], layers: int) -> list[str]:
    if types := config.get("layer_types"):
        return list(types)
    every = int(config.get("global_attn_every_n_layers", 3))
    return [FULL if i % every == 0 else SLIDING for i in range(layers)]


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, first: bool) -> None:
        super().__init__()
        h, eps = spec.hidden_size, spec.layer_norm_eps
        bias = bool(spec.config.get("attention_bias", False))
        norm_bias = bool(spec.config.get("norm_bias", False))
        self.heads, self.head_dim = spec.num_heads, spec.head_dim
        self.attn_norm = (
            nn.Identity() if first else nn.LayerNorm(h, eps=eps, bias=norm_bias)
        )  # the embeddings' norm precedes layer 0
        self.qkv = nn.Linear(h, 3 * h, bias=bias)
        self.attn_out = nn.Linear(h, h, bias=bias)
        self.mlp_norm = nn.LayerNorm(h, eps=eps, bias=norm_bias)
        self.mlp = GatedMLP(h, spec.intermediate_size, spec.activation, bias=bool(spec.config.get("mlp_bias", False)))

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: AttnMask,
        attention: Attention,
        ops: LinearOps,
    ) -> torch.Tensor:
        # x: [T, hidden]
        t = x.shape[0]
        q, k, v = ops.linear(self.attn_norm(x), self.qkv).view(t, 3, self.heads, self.head_dim).unbind(1)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        x = ops.linear_add(attention(q, k, v, mask).reshape(t, -1), self.attn_out, x)
        return self.mlp(self.mlp_norm(x), ops, residual=x)


class ClassifierHead(nn.Module):
    """Pooled state (cls or mean) -> dense, activation, norm -> classifier."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        c, h = spec.config, spec.hidden_size
        self.dense = nn.Linear(h, h, bias=bool(c.get("classifier_bias", False)))
        self.act = activation(c.get("classifier_activation", "gelu"))
        self.norm = nn.LayerNorm(h, eps=spec.layer_norm_eps, bias=bool(c.get("norm_bias", False)))
        self.out = nn.Linear(h, spec.num_labels)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.act(self.dense(pooled))))


class ModernBertEncoder(EncoderModel):
    PREFIXES = ("", "model.")
    PROBE = "embeddings.tok_embeddings.weight"

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        c, h = spec.config, spec.hidden_size
        self.types = layer_types(c, spec.num_layers)
        self.word = nn.Embedding(spec.vocab_size, h)
        self.norm = nn.LayerNorm(h, eps=spec.layer_norm_eps, bias=bool(c.get("norm_bias", False)))
        self.layers = nn.ModuleList(Block(spec, i == 0) for i in range(spec.num_layers))
        self.final_norm = nn.LayerNorm(h, eps=spec.layer_norm_eps, bias=bool(c.get("norm_bias", False)))
        self.rotary = nn.ModuleDict(
            {
                FULL: Rotary(
                    rope_parameters(c, FULL, theta_key="global_rope_theta", default_theta=160000.0), spec.head_dim
                ),
                SLIDING: Rotary(
                    rope_parameters(c, SLIDING, theta_key="local_rope_theta", default_theta=10000.0), spec.head_dim
                ),
            }
        )
        # a local layer's token sees the tokens within local_attention / 2 on either side
        self.mask_of = {FULL: AttnMask(), SLIDING: AttnMask(window=int(c.get("local_attention", 128)) // 2)}
        self.pooling = str(c.get("classifier_pooling", "cls"))
        self.head = ClassifierHead(spec) if spec.num_labels else None

    def forward(self, batch, attention: Attention, ops: LinearOps) -> torch.Tensor:
        x = self.norm(self.word(batch.input_ids))  # [T, hidden]
        ropes = {kind: rotary(batch.positions) for kind, rotary in self.rotary.items()}
        for kind, layer in zip(self.types, self.layers):
            x = layer(x, ropes[kind], self.mask_of[kind], attention, ops)
        return self.final_norm(x)

    def layer_masks(self) -> list[AttnMask]:
        return [self.mask_of[kind] for kind in self.types]

    def score(self, hidden: torch.Tensor, batch) -> torch.Tensor:
        pooled = pool(hidden, batch, "mean") if self.pooling == "mean" else hidden[batch.first].float()
        return self.scorer()(pooled.to(hidden.dtype)).float()

    def weight_names(self) -> dict[str, list[str]]:
        names = {
            "word.weight": ["embeddings.tok_embeddings.weight"],
            "norm.weight": ["embeddings.norm.weight"],
            "final_norm.weight": ["final_norm.weight"],
        }
        for i in range(self.spec.num_layers):
            hf, ours = f"layers.{i}.", f"layers.{i}."
            if i:
                names[f"{ours}attn_norm.weight"] = [f"{hf}attn_norm.weight"]
            names[f"{ours}qkv.weight"] = [f"{hf}attn.Wqkv.weight"]
            names[f"{ours}attn_out.weight"] = [f"{hf}attn.Wo.weight"]
            names[f"{ours}mlp_norm.weight"] = [f"{hf}mlp_norm.weight"]
            names[f"{ours}mlp.gate_up.weight"] = [f"{hf}mlp.Wi.weight"]  # [input | gate]: act(input) * gate
            names[f"{ours}mlp.down.weight"] = [f"{hf}mlp.Wo.weight"]
        return self._with_biases(names)

    def _with_biases(self, names: dict[str, list[str]]) -> dict[str, list[str]]:
        """The optional biases (attention_bias, mlp_bias, norm_bias), named like their weights."""
        params = dict(self.named_parameters())
        for ours, theirs in list(names.items()):
            bias = ours.replace(".weight", ".bias")
            if ours.endswith(".weight") and bias in params and bias not in names:
                names[bias] = [t.replace(".weight", ".bias") for t in theirs]
        return names

    def head_names(self) -> dict[str, list[str]]:
        if not self.spec.num_labels:
            return {}
        names = {
            "head.dense.weight": ["head.dense.weight"],
            "head.norm.weight": ["head.norm.weight"],
            "head.out.weight": ["classifier.weight"],
            "head.out.bias": ["classifier.bias"],
        }
        params = dict(self.named_parameters())
        for ours, theirs in (("head.dense.bias", "head.dense.bias"), ("head.norm.bias", "head.norm.bias")):
            if ours in params:
                names[ours] = [theirs]
        return names
