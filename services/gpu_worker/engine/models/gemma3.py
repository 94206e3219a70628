"""Gemma3 text (EmbeddingGemma): embeddings scaled by sqrt(hidden), four RMSNorms around each block
(scales stored as w - 1), per-head q/k norms, grouped-query attention scaled by
query_pre_attn_scalar, GeGLU MLP; sliding-window layers (their own rope base) between global ones.
EmbeddingGemma attends both ways (``use_bidirectional_attention``): its window is symmetric."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from embedfleet.services.gpu_worker.engine.attention import Attention, AttnMask
from embedfleet.services.gpu_worker.engine.layers.mlp import GatedMLP
from embedfleet.services.gpu_worker.engine.layers.norms import RMSNorm
from embedfleet.services.gpu_worker.engine.layers.rotary import Rotary, rope_parameters
from embedfleet.services.gpu_worker.engine.layers.self_attention import SelfAttention
from embedfleet.services.gpu_worker.engine.linear import LinearOps
from embedfleet.services.gpu_worker.engine.models.base import EncoderModel
from embedfleet.services.gpu_worker.engine.spec import ModelSpec, num_labels
from embedfleet.shared.model_dir.families import BY_TYPE

FULL, SLIDING = "full_attention", "sliding_attention"


def spec(config: dict[str, Any]) -> ModelSpec:
    heads = int(config["num_attention_heads"])
    return ModelSpec(
        model_type=config["model_type"],
        family=BY_TYPE[config["model_type"]].name,
        hidden_size=int(config["hidden_size"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim_override=int(config.get("head_dim") or 256),
        num_layers=int(config["num_hidden_layers"]),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        max_positions=int(config.get("max_position_embeddings", 131072)),
        layer_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        activation=config.get("hidden_activation", "gelu_pytorch_tanh"),
        num_labels=num_labels(config),
        causal=not config.get("use_bidirectional_attention", False),
        config=config,
    )


def layer_types(config: dict[str, Any], layers: int, pattern: int = 6) -> list[str]:
    if types := config.get("layer_types"):
        return list(types)
    pattern = int(config.get("sliding_window_pattern", pattern))  # every pattern-th layer is global
    return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(layers)]


class Block(nn.Module):
    """Gemma's block: pre- and post-norms around attention and MLP (Gemma2 the same, without q/k norms)."""

    def __init__(self, spec: ModelSpec, qk_norm: bool = True) -> None:
        super().__init__()
        h, eps, c = spec.hidden_size, spec.layer_norm_eps, spec.config
        bias = bool(c.get("attention_bias", False))
        self.input_norm = RMSNorm(h, eps, offset=True)
        self.attn = SelfAttention(
            h,
            spec.num_heads,
            spec.kv_heads,
            spec.head_dim,
            qkv_bias=bias,
            out_bias=bias,
            qk_norm_eps=eps if qk_norm else None,
            norm_offset=True,
        )
        self.post_attn_norm = RMSNorm(h, eps, offset=True)
        self.pre_mlp_norm = RMSNorm(h, eps, offset=True)
        self.mlp = GatedMLP(h, spec.intermediate_size, spec.activation)
        self.post_mlp_norm = RMSNorm(h, eps, offset=True)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: AttnMask,
        attention: Attention,
        ops: LinearOps,
    ) -> torch.Tensor:
        x = x + self.post_attn_norm(self.attn(self.input_norm(x), rope, mask, attention, ops))
        return x + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x), ops))


class Gemma3Encoder(EncoderModel):
    PREFIXES = ("", "model.")
    PROBE = "embed_tokens.weight"
    QK_NORM = True  # per-head q/k RMSNorms
    PATTERN = 6  # without layer_types, every PATTERN-th layer is global (sliding_window_pattern)

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        h = spec.hidden_size
        self.types = layer_types(spec.config, spec.num_layers, self.PATTERN)
        self.word = nn.Embedding(spec.vocab_size, h)
        self.embed_scale = math.sqrt(h)
        self.layers = nn.ModuleList(Block(spec, self.QK_NORM) for _ in range(spec.num_layers))
        self.norm = RMSNorm(h, spec.layer_norm_eps, offset=True)
        self.rotary = self.rotaries(spec)
        self.mask_of = self.attn_masks(spec)
        self.head = nn.Linear(h, spec.num_labels, bias=False) if spec.num_labels else None

    def rotaries(self, spec: ModelSpec) -> nn.ModuleDict:
        """Each layer type's rotary table."""
        c = spec.config
        return nn.ModuleDict(
            {
                FULL: Rotary(rope_parameters(c, FULL, default_theta=1_000_000.0), spec.head_dim),
                # local layers: their own base, never scaled
                SLIDING: Rotary(
                    rope_parameters(c, SLIDING, theta_key="rope_local_base_freq", scaling=False), spec.head_dim
                ),
            }
        )

    def attn_masks(self, spec: ModelSpec) -> dict[str, AttnMask]:
        """Each layer type's attention mask."""
        c = spec.config
        scale = float(c.get("query_pre_attn_scalar") or spec.head_dim) ** -0.5
        size = int(c.get("sliding_window") or 4096)
        # bidirectional (EmbeddingGemma): |i - j| <= sliding_window // 2 (transformers halves the config's
        # value); causal: i - sliding_window < j <= i
        w = size - 1 if spec.causal else size // 2
        return {
            FULL: AttnMask(causal=spec.causal, scale=scale),
            SLIDING: AttnMask(causal=spec.causal, window=w, scale=scale),
        }

    def forward(self, batch, attention: Attention, ops: LinearOps) -> torch.Tensor:
        x = self.word(batch.input_ids)
        x = x * float(torch.tensor(self.embed_scale).to(x.dtype))  # the scale rounded to the weights' dtype, as trained
        ropes = {kind: rotary(batch.positions) for kind, rotary in self.rotary.items()}
        for kind, layer in zip(self.types, self.layers):
            x = layer(x, ropes[kind], self.mask_of[kind], attention, ops)
        return self.norm(x)

    def layer_masks(self) -> list[AttnMask]:
        return [self.mask_of[kind] for kind in self.types]

    def score(self, hidden: torch.Tensor, batch) -> torch.Tensor:
        return self.scorer()(hidden[batch.last]).float()

    def weight_names(self) -> dict[str, list[str]]:
        names = {"word.weight": ["embed_tokens.weight"], "norm.weight": ["norm.weight"]}
        bias = bool(self.spec.config.get("attention_bias", False))
        for i in range(self.spec.num_layers):
            hf, ours = f"layers.{i}.", f"layers.{i}."
            for mine, theirs in (
                ("input_norm", "input_layernorm"),
                ("post_attn_norm", "post_attention_layernorm"),
                ("pre_mlp_norm", "pre_feedforward_layernorm"),
                ("post_mlp_norm", "post_feedforward_layernorm"),
            ):
                names[f"{ours}{mine}.weight"] = [f"{hf}{theirs}.weight"]
            names.update(SelfAttention.hf_names(f"{hf}self_attn.", f"{ours}attn.", bias, bias, self.QK_NORM))
            names[f"{ours}mlp.gate_up.weight"] = [f"{hf}mlp.gate_proj.weight", f"{hf}mlp.up_proj.weight"]
            names[f"{ours}mlp.down.weight"] = [f"{hf}mlp.down_proj.weight"]
        return names

    def head_names(self) -> dict[str, list[str]]:
        return {"head.weight": ["score.weight"]} if self.spec.num_labels else {}
