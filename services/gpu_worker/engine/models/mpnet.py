"""MPNet (all-mpnet-base-v2): BERT's post-norm layers without segment embeddings, plus a relative
position bias — one [buckets, heads] table shared by every layer, added to the attention scores."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from embedfleet.services.gpu_worker.engine.attention import AttnMask
from embedfleet.services.gpu_worker.engine.models.base import EncoderModel
from embedfleet.services.gpu_worker.engine.models.bert import BertEncoder, Layer, ScoreHead
from embedfleet.services.gpu_worker.engine.spec import ModelSpec, num_labels

MAX_DISTANCE = 128  # MPNet's bucket function: log-spaced buckets up to this distance


def spec(config: dict[str, Any]) -> ModelSpec:
    return ModelSpec(
        model_type="mpnet",
        family="MPNet",
        hidden_size=int(config["hidden_size"]),
        num_heads=int(config["num_attention_heads"]),
        num_layers=int(config["num_hidden_layers"]),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        max_positions=int(config["max_position_embeddings"]),
        layer_norm_eps=float(config.get("layer_norm_eps", 1e-5)),
        activation=config.get("hidden_act", "gelu"),
        position_offset=2,  # positions start after the padding index, which MPNet fixes at 1 whatever the config says
        num_labels=num_labels(config),
        config=config,
    )


def relative_buckets(length: int, num_buckets: int, device: torch.device) -> torch.Tensor:
    """[L, L] int64 bucket of key j relative to query i, as MPNet computes it (T5's scheme)."""
    i = torch.arange(length, device=device)
    n = i[:, None] - i[None, :]  # i - j
    half = num_buckets // 2
    ret = (n < 0).long() * half
    n = n.abs()
    exact = half // 2
    large = exact + (torch.log(n.float().clamp(min=1) / exact) / math.log(MAX_DISTANCE / exact) * (half - exact)).long()
    return ret + torch.where(n < exact, n, large.clamp(max=half - 1))


class RelativeBias(nn.Module):
    def __init__(self, num_buckets: int, heads: int) -> None:
        super().__init__()
        self.table = nn.Embedding(num_buckets, heads)

    def forward(self, length: int) -> torch.Tensor:
        # -> [heads, L, L] scores bias of a sequence of ``length`` tokens
        buckets = relative_buckets(length, self.table.num_embeddings, self.table.weight.device)
        return self.table(buckets).permute(2, 0, 1)


class MPNetEncoder(BertEncoder):
    """BERT's layers and heads; its own embeddings (no segments) and the relative bias in every layer's mask."""

    PREFIXES = ("", "mpnet.")
    PROBE = "encoder.relative_attention_bias.weight"
    USES_TOKEN_TYPES = False

    def __init__(self, spec: ModelSpec) -> None:
        EncoderModel.__init__(self, spec)
        h = spec.hidden_size
        self.word = nn.Embedding(spec.vocab_size, h)
        self.position = nn.Embedding(spec.max_positions, h)
        self.norm = nn.LayerNorm(h, eps=spec.layer_norm_eps)
        self.bias = RelativeBias(int(spec.config.get("relative_attention_num_buckets", 32)), spec.num_heads)
        self.layers = nn.ModuleList(Layer(spec) for _ in range(spec.num_layers))
        self.mask = AttnMask(bias=self.bias)
        self.head = ScoreHead(spec) if spec.num_labels else None

    def embed(self, batch) -> torch.Tensor:
        return self.norm(self.word(batch.input_ids) + self.position(batch.positions))  # [T, hidden]

    def weight_names(self) -> dict[str, list[str]]:
        names = {
            "word.weight": ["embeddings.word_embeddings.weight"],
            "position.weight": ["embeddings.position_embeddings.weight"],
            "norm.weight": ["embeddings.LayerNorm.weight"],
            "norm.bias": ["embeddings.LayerNorm.bias"],
            "bias.table.weight": ["encoder.relative_attention_bias.weight"],
        }
        for i in range(self.spec.num_layers):
            names.update(
                Layer.hf_names(
                    f"encoder.layer.{i}.",
                    f"layers.{i}.",
                    "attention.attn",
                    ("q", "k", "v"),
                    "attention.attn.o",
                    "attention.LayerNorm",
                )
            )
        return names

    def head_names(self) -> dict[str, list[str]]:
        return ScoreHead.hf_names("mpnet.") if self.spec.num_labels else {}
