"""GTE (gte-multilingual-base, gte-*-en-v1.5, snowflake-arctic-embed-m-v2.0): BERT-like post-norm blocks
with rotary positions instead of position embeddings, a fused QKV projection, and a gated MLP whose
fused projection holds [up; gate] rows (``mlp.up_gate_proj``), a bias on its down projection only.

Published checkpoints name the model ``GteModel`` (model_type ``gte``) or, older ones, ``NewModel``
(model_type ``new``, tensors under a ``new.`` prefix when saved from a wrapper); both carry the names
below, which are also what transformers' ``GteModel.save_pretrained`` writes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from embedfleet.services.gpu_worker.engine.attention import FULL, Attention, AttnMask
from embedfleet.services.gpu_worker.engine.layers.post_norm import RotaryPostNormBlock
from embedfleet.services.gpu_worker.engine.layers.rotary import Rotary, rope_parameters
from embedfleet.services.gpu_worker.engine.linear import LinearOps
from embedfleet.services.gpu_worker.engine.models.base import EncoderModel
from embedfleet.services.gpu_worker.engine.spec import ModelSpec
from embedfleet.shared.config.option import ConfigError


def spec(config: dict[str, Any]) -> ModelSpec:
    if config.get("position_embedding_type", "rope") != "rope":
        raise ConfigError(f"GTE position_embedding_type {config['position_embedding_type']!r} is not supported (rope)")
    if config.get("layer_norm_type", "layer_norm") != "layer_norm":
        raise ConfigError(f"GTE layer_norm_type {config['layer_norm_type']!r} is not supported (layer_norm)")
    if config.get("logn_attention_scale"):
        raise ConfigError("GTE logn_attention_scale is not supported")
    if any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or []):
        raise ConfigError("GTE sequence classifiers (rerankers) are not served yet; GTE embedders are")
    heads = int(config["num_attention_heads"])
    kind = gte_rope_parameters(config, int(config["hidden_size"]) // heads)["rope_type"]
    if kind not in ("default", "linear"):  # refused here, so `embedfleet check` names it too
        raise ConfigError(f"GTE rope scaling {kind!r} is not supported (supported: none, 'ntk' (fixed), 'linear')")
    return ModelSpec(
        model_type=str(config.get("model_type", "gte")),
        family="GTE",
        hidden_size=int(config["hidden_size"]),
        num_heads=heads,
        num_layers=int(config["num_hidden_layers"]),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        max_positions=int(config.get("max_position_embeddings", 8192)),
        layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
        activation=config.get("hidden_act", "gelu"),
        config=config,
    )


def gte_rope_parameters(config: dict[str, Any], head_dim: int) -> dict[str, Any]:
    """The rope parameters, with the fixed NTK scaling of gte-*-en-v1.5 (``rope_scaling: {type: ntk,
    factor: f}``) rewritten as what it computes: base theta * f, every frequency divided by f^(2 / d)
    — linear scaling by f^(2 / d) over theta * f. (The reference code, and vLLM's NTKScalingRotaryEmbedding,
    apply it at every length; transformers 5 has no "ntk" rope type and refuses such a config.)"""
    params = rope_parameters(config, default_theta=160000.0)
    if params["rope_type"] != "ntk":
        return params
    if params.get("mixed_b") is not None:
        raise ConfigError("GTE rope scaling 'ntk' with mixed_b is not supported (fixed NTK only)")
    factor = float(params["factor"])
    return {"rope_type": "linear", "rope_theta": params["rope_theta"] * factor, "factor": factor ** (2 / head_dim)}


class GteEncoder(EncoderModel):
    PREFIXES = ("", "new.", "gte.")
    PROBE = "embeddings.word_embeddings.weight"

    BIASES = True  # on the QKV, output and down projections (NomicBERT, which reuses this encoder: none)
    TYPE_VOCAB = 1  # type_vocab_size when the config says none

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        h = spec.hidden_size
        self.word = nn.Embedding(spec.vocab_size, h)
        # gte-base-en-v1.5 has type_vocab_size 0: no token-type embedding; the others add row 0 (ids are all 0)
        types = int(spec.config.get("type_vocab_size", self.TYPE_VOCAB))
        self.token_type = nn.Embedding(types, h) if types else None
        self.norm = nn.LayerNorm(h, eps=spec.layer_norm_eps)
        self.rotary = Rotary(self.rope_parameters(), spec.head_dim)
        self.layers = nn.ModuleList(
            RotaryPostNormBlock(spec, attention_bias=self.BIASES, down_bias=self.BIASES) for _ in range(spec.num_layers)
        )

    def rope_parameters(self) -> dict[str, Any]:
        return gte_rope_parameters(self.spec.config, self.spec.head_dim)

    def forward(self, batch, attention: Attention, ops: LinearOps) -> torch.Tensor:
        x = self.word(batch.input_ids)  # [T, hidden]
        if self.token_type is not None:
            x = x + self.token_type.weight[0]
        x = self.norm(x)
        rope = self.rotary(batch.positions)
        for layer in self.layers:
            x = layer(x, rope, attention, ops)
        return x

    def layer_masks(self) -> list[AttnMask]:
        return [FULL] * self.spec.num_layers

    def score(self, hidden: torch.Tensor, batch) -> torch.Tensor:
        raise AssertionError(f"{self.spec.family} classifiers are refused by spec()")

    def weight_names(self) -> dict[str, list[str]]:
        names = {
            "word.weight": ["embeddings.word_embeddings.weight"],
            "norm.weight": ["embeddings.LayerNorm.weight"],
            "norm.bias": ["embeddings.LayerNorm.bias"],
        }
        if self.token_type is not None:
            names["token_type.weight"] = ["embeddings.token_type_embeddings.weight"]
        for i in range(self.spec.num_layers):
            hf, ours = f"encoder.layer.{i}.", f"layers.{i}."
            names[f"{ours}mlp.gate_up.weight"] = [f"{hf}mlp.up_gate_proj.weight"]  # [up; gate]: see weight_tensor
            for kind in ("weight", "bias"):
                names[f"{ours}qkv.{kind}"] = [f"{hf}attention.qkv_proj.{kind}"]
                names[f"{ours}attn_out.{kind}"] = [f"{hf}attention.o_proj.{kind}"]
                names[f"{ours}attn_norm.{kind}"] = [f"{hf}attn_ln.{kind}"]
                names[f"{ours}mlp.down.{kind}"] = [f"{hf}mlp.down_proj.{kind}"]
                names[f"{ours}mlp_norm.{kind}"] = [f"{hf}mlp_ln.{kind}"]
        return names

    def weight_tensor(self, ours: str, tensor: torch.Tensor) -> torch.Tensor:
        if ours.endswith("mlp.gate_up.weight"):  # the checkpoint's [up; gate] rows as GatedMLP's [gate; up]
            up, gate = tensor.chunk(2, dim=0)
            return torch.cat([gate, up], dim=0)
        return tensor
