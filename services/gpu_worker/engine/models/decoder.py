"""Decoder-only embedders and rerankers: Qwen3, Qwen2, Mistral, Llama (Qwen3-Embedding, gte-Qwen2,
e5-mistral, …). Pre-norm blocks with RMSNorm, rotary positions, grouped-query attention, SwiGLU;
causal unless the config turns it off (``is_causal: false`` or ``use_bidirectional_attention``).
An embedding is a prefill: no KV cache, the last token of each packed sequence pools. A reranker reads
the last token too: through its ``score`` row (sequence classification), or, for an LLM reranker
(Qwen3-Reranker), through the LM head's rows of its answer tokens ("yes" less "no")."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
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


def bidirectional(config: dict[str, Any]) -> bool:
    return bool(config.get("use_bidirectional_attention")) or config.get("is_causal") is False


def spec(config: dict[str, Any]) -> ModelSpec:
    model_type = config["model_type"]
    heads = int(config["num_attention_heads"])
    return ModelSpec(
        model_type=model_type,
        family=BY_TYPE[model_type].name,
        hidden_size=int(config["hidden_size"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim_override=int(config.get("head_dim") or 0),
        num_layers=int(config["num_hidden_layers"]),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        max_positions=int(config.get("max_position_embeddings", 32768)),
        layer_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        activation=config.get("hidden_act", "silu"),
        num_labels=num_labels(config),
        causal=not bidirectional(config),
        config=config,
    )


def window(config: dict[str, Any]) -> int | None:
    """The sliding window as tokens seen besides the query's own (None: every layer sees it all).
    Mistral applies ``sliding_window`` wherever set; Qwen only with ``use_sliding_window``."""
    size = config.get("sliding_window")
    if not size or (config["model_type"].startswith("qwen") and not config.get("use_sliding_window")):
        return None
    return int(size) - 1  # HF: key j is seen when j > i - sliding_window


def layer_masks(config: dict[str, Any], layers: int, causal: bool) -> list[AttnMask]:
    w = window(config)
    types = config.get("layer_types") or []
    if w is not None and not types:
        start = int(config.get("max_window_layers", 0)) if config["model_type"].startswith("qwen") else 0
        types = ["full_attention" if i < start else "sliding_attention" for i in range(layers)]
    full, sliding = AttnMask(causal=causal), AttnMask(causal=causal, window=w)
    return [sliding if w is not None and t == "sliding_attention" else full for t in types] or [full] * layers


class Block(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        c, h, eps = spec.config, spec.hidden_size, spec.layer_norm_eps
        self.input_norm = RMSNorm(h, eps)
        self.attn = SelfAttention(
            h,
            spec.num_heads,
            spec.kv_heads,
            spec.head_dim,
            qkv_bias=qkv_bias(c),
            out_bias=bool(c.get("attention_bias")),
            qk_norm_eps=eps if spec.model_type == "qwen3" else None,
        )
        self.post_norm = RMSNorm(h, eps)
        self.mlp = GatedMLP(h, spec.intermediate_size, spec.activation, bias=bool(c.get("mlp_bias")))

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: AttnMask,
        attention: Attention,
        ops: LinearOps,
    ) -> torch.Tensor:
        x = self.attn(self.input_norm(x), rope, mask, attention, ops, residual=x)
        return self.mlp(self.post_norm(x), ops, residual=x)


def qkv_bias(config: dict[str, Any]) -> bool:
    return config["model_type"] == "qwen2" or bool(config.get("attention_bias"))


class DecoderEncoder(EncoderModel):
    PREFIXES = ("", "model.")
    PROBE = "embed_tokens.weight"

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        h = spec.hidden_size
        self.word = nn.Embedding(spec.vocab_size, h)
        self.layers = nn.ModuleList(Block(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(h, spec.layer_norm_eps)
        self.rotary = Rotary(rope_parameters(spec.config), spec.head_dim)
        self.layer_mask = layer_masks(spec.config, spec.num_layers, spec.causal)
        # an LLM reranker's head: the LM head's rows of its answer tokens [1 or 2, hidden], not the vocabulary
        rows = len(spec.score_tokens) or spec.num_labels
        self.head = nn.Linear(h, rows, bias=False) if rows else None

    def forward(self, batch, attention: Attention, ops: LinearOps) -> torch.Tensor:
        x = self.word(batch.input_ids)  # [T, hidden]
        rope = self.rotary(batch.positions)
        for mask, layer in zip(self.layer_mask, self.layers):
            x = layer(x, rope, mask, attention, ops)
        return self.norm(x)

    def layer_masks(self) -> list[AttnMask]:
        return list(self.layer_mask)

    def score(self, hidden: torch.Tensor, batch) -> torch.Tensor:
        # a decoder classifier reads its last token (transformers: the last non-padding one)
        head = self.scorer()
        if not self.spec.score_tokens:
            return head(hidden[batch.last]).float()
        # LogitScore: logit[true] - logit[false], each a float32 dot product (the difference of two
        # logits of similar size loses digits in half precision)
        assert isinstance(head, nn.Linear)  # the answer tokens' rows, made in __init__
        logits = F.linear(hidden[batch.last].float(), head.weight.float())  # [R, 1 or 2]
        return logits[:, :1] - logits[:, 1:] if logits.shape[1] == 2 else logits

    def weight_names(self) -> dict[str, list[str]]:
        c = self.spec.config
        names = {"word.weight": ["embed_tokens.weight"], "norm.weight": ["norm.weight"]}
        for i in range(self.spec.num_layers):
            hf, ours = f"layers.{i}.", f"layers.{i}."
            names[f"{ours}input_norm.weight"] = [f"{hf}input_layernorm.weight"]
            names[f"{ours}post_norm.weight"] = [f"{hf}post_attention_layernorm.weight"]
            names.update(
                SelfAttention.hf_names(
                    f"{hf}self_attn.",
                    f"{ours}attn.",
                    qkv_bias(c),
                    bool(c.get("attention_bias")),
                    self.spec.model_type == "qwen3",
                )
            )
            names[f"{ours}mlp.gate_up.weight"] = [f"{hf}mlp.gate_proj.weight", f"{hf}mlp.up_proj.weight"]
            names[f"{ours}mlp.down.weight"] = [f"{hf}mlp.down_proj.weight"]
            if c.get("mlp_bias"):
                names[f"{ours}mlp.gate_up.bias"] = [f"{hf}mlp.gate_proj.bias", f"{hf}mlp.up_proj.bias"]
                names[f"{ours}mlp.down.bias"] = [f"{hf}mlp.down_proj.bias"]
        return names

    def head_names(self) -> dict[str, list[str]]:
        if self.spec.score_tokens:
            # the LM head, or with tied embeddings the input embeddings it shares (transformers' default
            # for these families is untied)
            tied = bool(self.spec.config.get("tie_word_embeddings", False))
            return {"head.weight": ["model.embed_tokens.weight", "embed_tokens.weight"] if tied else ["lm_head.weight"]}
        return {"head.weight": ["score.weight"]} if self.spec.num_labels else {}

    def head_tensor(self, ours: str, tensor: torch.Tensor) -> torch.Tensor:
        # an LLM reranker keeps only its answer tokens' rows of the [vocab, hidden] LM head
        return tensor[list(self.spec.score_tokens)] if self.spec.score_tokens else tensor
