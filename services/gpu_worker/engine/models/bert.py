"""BERT family (BERT, MiniLM, bge, e5, gte, RoBERTa, XLM-RoBERTa, CamemBERT) over packed sequences.

Written here rather than taken from transformers: the HF forward checks masks on the host, which
syncs the device and prevents CUDA-graph capture; this one runs on a flat [T, hidden] token tensor
with no padding and no host syncs inside the layers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from embedfleet.services.gpu_worker.engine.attention import FULL, Attention, AttnMask
from embedfleet.services.gpu_worker.engine.linear import LinearOps
from embedfleet.services.gpu_worker.engine.models.base import EncoderModel
from embedfleet.services.gpu_worker.engine.spec import ModelSpec, num_labels
from embedfleet.shared.model_dir.families import BY_TYPE, position_offset


def spec(config: dict[str, Any]) -> ModelSpec:
    model_type = config.get("model_type", "bert")
    if config.get("position_embedding_type", "absolute") != "absolute":
        from embedfleet.shared.config.option import ConfigError

        raise ConfigError("only absolute position embeddings are supported for BERT-family models")
    return ModelSpec(
        model_type=model_type,
        family=BY_TYPE[model_type].name,
        hidden_size=int(config["hidden_size"]),
        num_heads=int(config["num_attention_heads"]),
        num_layers=int(config["num_hidden_layers"]),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        max_positions=int(config["max_position_embeddings"]),
        type_vocab_size=int(config.get("type_vocab_size", 2)),
        layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
        activation=config.get("hidden_act", "gelu"),
        position_offset=position_offset(config),
        num_labels=num_labels(config),
        config=config,
    )


class Embeddings(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.word = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.position = nn.Embedding(spec.max_positions, spec.hidden_size)
        self.token_type = nn.Embedding(spec.type_vocab_size, spec.hidden_size)
        self.norm = nn.LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, token_types: torch.Tensor) -> torch.Tensor:
        # all [T] -> [T, hidden]
        return self.norm(self.word(input_ids) + self.position(positions) + self.token_type(token_types))


class Layer(nn.Module):
    """Post-norm block: attention + residual, norm; MLP + residual, norm (BERT and MPNet)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h = spec.hidden_size
        self.heads, self.head_dim = spec.num_heads, spec.head_dim
        self.qkv = nn.Linear(h, 3 * h)  # query, key, value fused into one GEMM
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=spec.layer_norm_eps)
        self.up = nn.Linear(h, spec.intermediate_size)
        self.down = nn.Linear(spec.intermediate_size, h)
        self.mlp_norm = nn.LayerNorm(h, eps=spec.layer_norm_eps)
        self.activation = spec.activation

    def forward(self, x: torch.Tensor, attention: Attention, ops: LinearOps, mask: AttnMask = FULL) -> torch.Tensor:
        # x: [T, hidden]
        t = x.shape[0]
        q, k, v = ops.linear(x, self.qkv).view(t, 3, self.heads, self.head_dim).unbind(1)  # each [T, heads, d]
        a = attention(q, k, v, mask).reshape(t, -1)
        x = self.attn_norm(ops.linear_add(a, self.attn_out, x))
        return self.mlp_norm(ops.linear_add(ops.linear_act(x, self.up, self.activation), self.down, x))

    @staticmethod
    def hf_names(
        hf: str, ours: str, attention: str, qkv: tuple[str, str, str], attn_out: str, attn_norm: str
    ) -> dict[str, list[str]]:
        """Checkpoint names of one layer under ``hf``: ``attention`` is the self-attention's path and
        ``qkv`` its projections; ``attn_out`` and ``attn_norm`` the paths after it."""
        names = {}
        for kind in ("weight", "bias"):
            names[f"{ours}qkv.{kind}"] = [f"{hf}{attention}.{p}.{kind}" for p in qkv]
            names[f"{ours}attn_out.{kind}"] = [f"{hf}{attn_out}.{kind}"]
            names[f"{ours}attn_norm.{kind}"] = [f"{hf}{attn_norm}.{kind}"]
            names[f"{ours}up.{kind}"] = [f"{hf}intermediate.dense.{kind}"]
            names[f"{ours}down.{kind}"] = [f"{hf}output.dense.{kind}"]
            names[f"{ours}mlp_norm.{kind}"] = [f"{hf}output.LayerNorm.{kind}"]
        return names


class ScoreHead(nn.Module):
    """A cross-encoder's head on the first token: dense + tanh, then the classifier (BERT's pooler and
    classifier, or RoBERTa's / MPNet's classifier.dense and classifier.out_proj: the same computation)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.dense = nn.Linear(spec.hidden_size, spec.hidden_size)
        self.out = nn.Linear(spec.hidden_size, spec.num_labels)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        # [R, hidden] -> [R, labels]
        return self.out(torch.tanh(self.dense(first)))

    @staticmethod
    def hf_names(prefix: str = "bert.") -> dict[str, list[str]]:
        names = {}
        for kind in ("weight", "bias"):
            names[f"head.dense.{kind}"] = [
                f"{prefix}pooler.dense.{kind}",
                f"pooler.dense.{kind}",
                f"classifier.dense.{kind}",
            ]
            names[f"head.out.{kind}"] = [f"classifier.{kind}", f"classifier.out_proj.{kind}"]
        return names


class BertEncoder(EncoderModel):
    PREFIXES: tuple[str, ...] = ("", "bert.", "roberta.", "model.")
    PROBE = "embeddings.word_embeddings.weight"
    USES_TOKEN_TYPES = True

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.embeddings = Embeddings(spec)
        self.layers = nn.ModuleList(Layer(spec) for _ in range(spec.num_layers))
        self.mask = FULL
        self.head = ScoreHead(spec) if spec.num_labels else None

    def embed(self, batch) -> torch.Tensor:
        # batch.input_ids, .positions, .token_types: [T] int -> [T, hidden]
        return self.embeddings(batch.input_ids, batch.positions, batch.token_types)

    def forward(self, batch, attention: Attention, ops: LinearOps) -> torch.Tensor:
        x = self.embed(batch)  # [T, hidden]
        for layer in self.layers:
            x = layer(x, attention, ops, self.mask)
        return x

    def layer_masks(self) -> list[AttnMask]:
        return [self.mask] * self.spec.num_layers

    def score(self, hidden: torch.Tensor, batch) -> torch.Tensor:
        return self.scorer()(hidden[batch.first]).float()

    def weight_names(self) -> dict[str, list[str]]:
        names = {
            "embeddings.word.weight": ["embeddings.word_embeddings.weight"],
            "embeddings.position.weight": ["embeddings.position_embeddings.weight"],
            "embeddings.token_type.weight": ["embeddings.token_type_embeddings.weight"],
            "embeddings.norm.weight": ["embeddings.LayerNorm.weight"],
            "embeddings.norm.bias": ["embeddings.LayerNorm.bias"],
        }
        for i in range(self.spec.num_layers):
            names.update(
                Layer.hf_names(
                    f"encoder.layer.{i}.",
                    f"layers.{i}.",
                    "attention.self",
                    ("query", "key", "value"),
                    "attention.output.dense",
                    "attention.output.LayerNorm",
                )
            )
        return names

    def head_names(self) -> dict[str, list[str]]:
        return ScoreHead.hf_names() if self.spec.num_labels else {}
