"""BERT-family encoder (BERT, MiniLM, bge, e5, gte, XLM-RoBERTa) over packed sequences.

Written here rather than taken from transformers: the HF forward checks masks on the host, which
syncs the device and prevents CUDA-graph capture; this one runs on a flat [T, hidden] token tensor
with no padding and no host syncs inside the layers.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from services.gpu_worker.engine.linear import LinearOps
from services.gpu_worker.engine.spec import ModelSpec

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


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

    def forward(self, x: torch.Tensor, attention: Attention, ops: LinearOps) -> torch.Tensor:
        # x: [T, hidden]; post-norm residual blocks as in BERT
        t = x.shape[0]
        q, k, v = ops.linear(x, self.qkv).view(t, 3, self.heads, self.head_dim).unbind(1)  # each [T, heads, d]
        a = attention(q, k, v).reshape(t, -1)
        x = self.attn_norm(ops.linear_add(a, self.attn_out, x))
        return self.mlp_norm(ops.linear_add(ops.linear_act(x, self.up, self.activation), self.down, x))


class ScoreHead(nn.Module):
    """A cross-encoder's head on the first token: dense + tanh, then the classifier (BERT's pooler and
    classifier, or RoBERTa's classifier.dense and classifier.out_proj: the same computation)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.dense = nn.Linear(spec.hidden_size, spec.hidden_size)
        self.out = nn.Linear(spec.hidden_size, spec.num_labels)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        # [R, hidden] -> [R, labels]
        return self.out(torch.tanh(self.dense(first)))


class BertEncoder(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embeddings = Embeddings(spec)
        self.layers = nn.ModuleList(Layer(spec) for _ in range(spec.num_layers))
        self.head = ScoreHead(spec) if spec.num_labels else None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        token_types: torch.Tensor,
        attention: Attention,
        ops: LinearOps,
    ) -> torch.Tensor:
        # input_ids, positions, token_types: [T] int -> hidden states [T, hidden]
        x = self.embeddings(input_ids, positions, token_types)
        for layer in self.layers:
            x = layer(x, attention, ops)
        return x


def hf_weight_names(spec: ModelSpec) -> dict[str, list[str]]:
    """Our parameter name -> the Hugging Face tensor names it is made of (several: concatenated)."""
    names = {
        "embeddings.word.weight": ["embeddings.word_embeddings.weight"],
        "embeddings.position.weight": ["embeddings.position_embeddings.weight"],
        "embeddings.token_type.weight": ["embeddings.token_type_embeddings.weight"],
        "embeddings.norm.weight": ["embeddings.LayerNorm.weight"],
        "embeddings.norm.bias": ["embeddings.LayerNorm.bias"],
    }
    for i in range(spec.num_layers):
        hf, ours = f"encoder.layer.{i}.", f"layers.{i}."
        for kind in ("weight", "bias"):
            names[f"{ours}qkv.{kind}"] = [f"{hf}attention.self.{p}.{kind}" for p in ("query", "key", "value")]
            names[f"{ours}attn_out.{kind}"] = [f"{hf}attention.output.dense.{kind}"]
            names[f"{ours}attn_norm.{kind}"] = [f"{hf}attention.output.LayerNorm.{kind}"]
            names[f"{ours}up.{kind}"] = [f"{hf}intermediate.dense.{kind}"]
            names[f"{ours}down.{kind}"] = [f"{hf}output.dense.{kind}"]
            names[f"{ours}mlp_norm.{kind}"] = [f"{hf}output.LayerNorm.{kind}"]
    return names


def hf_head_names(spec: ModelSpec) -> dict[str, list[list[str]]]:
    """Our head parameter -> the checkpoint names it may have (absolute, no encoder prefix): BERT's
    pooler + classifier, or RoBERTa's classification head."""
    names = {}
    for kind in ("weight", "bias"):
        names[f"head.dense.{kind}"] = [f"bert.pooler.dense.{kind}", f"pooler.dense.{kind}", f"classifier.dense.{kind}"]
        names[f"head.out.{kind}"] = [f"classifier.{kind}", f"classifier.out_proj.{kind}"]
    return names if spec.num_labels else {}
