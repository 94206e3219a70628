"""jina-embeddings-v3: XLM-RoBERTa's shape (post-norm blocks, a fused QKV projection, a GELU MLP
``fc1`` -> act -> ``fc2``, biases everywhere, the embeddings' norm ``emb_ln``) with rotary positions
instead of position embeddings, and task adapters (LoRA) on every linear layer and embedding table,
chosen per row of one packed batch (layers/lora.py).

Two checkpoint forms are read:
- transformers 5's ``JinaEmbeddingsV3Model`` (model_type ``jina_embeddings_v3``, rope base in
  ``rope_parameters``, default 20000): ``save_pretrained`` writes the names below and no adapters;
- the published one (jinaai/jina-embeddings-v3, custom code from jinaai/xlm-roberta-flash-implementation):
  model_type ``xlm-roberta`` with ``position_embedding_type: rotary`` (the registry routes such a
  config here), rope base ``rotary_emb_base`` (the code's default 10000; the checkpoint says 20000),
  tensors under ``roberta.`` and the adapters beside the base weights.

The published adapters (modeling_lora.py's LoRAParametrization, registered with torch's parametrize
on every nn.Linear and nn.Embedding of the model, so a state dict names them as below):
- config.json: ``lora_adaptations`` (the task names, adapter i at index i of every stacked tensor),
  ``lora_rank`` r (4), ``lora_alpha`` (1); scale = lora_alpha / lora_rank; dropout is training-only.
- an adapted layer X keeps its bias at ``X.bias``; its weight moves to ``X.parametrizations.weight.original``
  and the pairs sit at ``X.parametrizations.weight.0.lora_A`` / ``.lora_B``:
    linear (weight [out, in]):      lora_A [n, r, in],    lora_B [n, out, r]; W_i = W + scale * B_i @ A_i
    embedding (weight [vocab, dim]): lora_A [n, vocab, r], lora_B [n, r, dim]; E_i = E + scale * A_i @ B_i
- adapted here: the word and token-type embeddings, and in every layer ``mixer.Wqkv``, ``mixer.out_proj``,
  ``mlp.fc1``, ``mlp.fc2`` (the pooler's dense layer has them too; pooling here never runs it).
  The token-type table has one row (type 0, every token's), so its adapter adds one vector per task.
A config without ``lora_adaptations`` is the base model (no adapters); one that lists them needs
every pair, of these shapes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from embedfleet.services.gpu_worker.engine.attention import FULL, Attention, AttnMask
from embedfleet.services.gpu_worker.engine.layers.lora import EmbeddingAdapters, LinearAdapters, adapter_mask
from embedfleet.services.gpu_worker.engine.layers.rotary import Rotary, apply_rotary, inv_frequencies, rope_parameters
from embedfleet.services.gpu_worker.engine.linear import LinearOps, activation
from embedfleet.services.gpu_worker.engine.models.base import EncoderModel
from embedfleet.services.gpu_worker.engine.spec import ModelSpec
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.load import task_adapters

FAMILY = "JinaV3"
NATIVE = "jina_embeddings_v3"
# our linear -> the checkpoint's, in every layer
_LINEARS = {"qkv": "mixer.Wqkv", "attn_out": "mixer.out_proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}


def spec(config: dict[str, Any]) -> ModelSpec:
    if any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or []):
        raise ConfigError("jina-embeddings-v3 sequence classifiers are not served; its embedders are")
    if config.get("position_embedding_type", "rotary") != "rotary":
        raise ConfigError(f"{FAMILY} position_embedding_type {config['position_embedding_type']!r} is not supported")
    if config.get("rotary_emb_scale_base") is not None:
        raise ConfigError(f"{FAMILY} rotary_emb_scale_base (xPos scaling) is not supported")
    if config.get("rotary_emb_interleaved"):
        raise ConfigError(f"{FAMILY} rotary_emb_interleaved: true is not supported")
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    if float(config.get("rotary_emb_dim") or hidden // heads) != hidden // heads:
        raise ConfigError(f"{FAMILY} rotary_emb_dim below the head size is not supported")
    inv_frequencies(jina_rope_parameters(config), hidden // heads)  # a ConfigError for what Rotary lacks
    lora_settings(config)
    return ModelSpec(
        model_type=str(config.get("model_type", NATIVE)),
        family=FAMILY,
        hidden_size=hidden,
        num_heads=heads,
        num_layers=int(config["num_hidden_layers"]),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        max_positions=int(config.get("max_position_embeddings", 8194)),
        layer_norm_eps=float(config.get("layer_norm_eps", 1e-5)),
        activation=str(config.get("hidden_act", "gelu")),
        type_vocab_size=int(config.get("type_vocab_size", 1)),
        config=config,
    )


def jina_rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """transformers' ``rope_parameters``, else the published ``rotary_emb_base`` (its code's default 10000)."""
    default = 20000.0 if config.get("model_type") == NATIVE else 10000.0
    return rope_parameters(config, theta_key="rotary_emb_base", default_theta=default)


def lora_settings(config: dict[str, Any]) -> tuple[tuple[str, ...], int, float]:
    """(task names, rank, scale alpha / rank) of the config's adapters; ((), 0, 0.0) for none."""
    names = task_adapters(config)  # the names the tokenizer lets a request choose, checked once for both
    if not names:
        return (), 0, 0.0
    rank = config.get("lora_rank", 4)
    if not isinstance(rank, int) or rank < 1:
        raise ConfigError(f"config.json: lora_rank must be a positive integer, not {rank!r}")
    return tuple(names), rank, float(config.get("lora_alpha", 1)) / rank


class BlockAdapters(nn.Module):
    """The task adapters of one block's four linear layers."""

    def __init__(self, spec: ModelSpec, count: int, rank: int) -> None:
        super().__init__()
        h, i = spec.hidden_size, spec.intermediate_size
        self.qkv = LinearAdapters(h, 3 * h, count, rank)
        self.attn_out = LinearAdapters(h, h, count, rank)
        self.fc1 = LinearAdapters(h, i, count, rank)
        self.fc2 = LinearAdapters(i, h, count, rank)


class JinaV3Block(nn.Module):
    """Attention with rotary positions + residual, LayerNorm; act(fc1) -> fc2 + residual, LayerNorm.
    Each linear's adapter delta (zero for a token of no adapter) joins its output; where the output
    meets a residual, the delta rides in with the residual so the fused linear + add stays one op."""

    def __init__(self, spec: ModelSpec, adapters: tuple[int, int] | None) -> None:
        super().__init__()
        h, eps = spec.hidden_size, spec.layer_norm_eps
        self.heads, self.head_dim = spec.num_heads, spec.head_dim
        self.qkv = nn.Linear(h, 3 * h)  # rows [q; k; v]
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=eps)
        self.fc1 = nn.Linear(h, spec.intermediate_size)
        self.fc2 = nn.Linear(spec.intermediate_size, h)
        self.mlp_norm = nn.LayerNorm(h, eps=eps)
        self.activation = spec.activation
        self.act = activation(spec.activation)
        self.adapters = BlockAdapters(spec, *adapters) if adapters else None

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        attention: Attention,
        ops: LinearOps,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        # x: [T, hidden]; mask: [T, adapters * rank] (None: a model without adapters)
        t = x.shape[0]
        lora = self.adapters if mask is not None else None
        qkv = ops.linear(x, self.qkv)  # [T, 3 * hidden]
        if lora is not None:
            qkv = qkv + lora.qkv(x, mask)
        q, k, v = qkv.view(t, 3, self.heads, self.head_dim).unbind(1)  # each [T, heads, d]
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        a = attention(q, k, v, FULL).reshape(t, -1)
        x = self.attn_norm(ops.linear_add(a, self.attn_out, x if lora is None else x + lora.attn_out(a, mask)))
        if lora is None:
            return self.mlp_norm(ops.linear_add(ops.linear_act(x, self.fc1, self.activation), self.fc2, x))
        h = self.act(ops.linear(x, self.fc1) + lora.fc1(x, mask))  # the delta inside the activation
        return self.mlp_norm(ops.linear_add(h, self.fc2, x + lora.fc2(h, mask)))


class JinaV3Encoder(EncoderModel):
    PREFIXES = ("", "roberta.")  # the published checkpoint wraps the model as XLMRobertaLoRA.roberta
    PROBE = "emb_ln.weight"  # the embeddings' weights move under parametrizations where adapted

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        names, self.rank, self.scale = lora_settings(spec.config)
        self.adapter_names = names
        adapters = (len(names), self.rank) if names else None
        h, vocab, types = spec.hidden_size, spec.vocab_size, spec.type_vocab_size
        self.word = nn.Embedding(vocab, h)
        self.token_type = nn.Embedding(types, h) if types else None  # type 0 for every token
        self.norm = nn.LayerNorm(h, eps=spec.layer_norm_eps)
        self.rotary = Rotary(jina_rope_parameters(spec.config), spec.head_dim)
        self.layers = nn.ModuleList(JinaV3Block(spec, adapters) for _ in range(spec.num_layers))
        self.word_adapters = EmbeddingAdapters(vocab, h, *adapters) if adapters else None
        self.type_adapters = EmbeddingAdapters(types, h, *adapters) if adapters and types else None

    def forward(self, batch, attention: Attention, ops: LinearOps) -> torch.Tensor:
        ids = batch.input_ids  # [T]
        x = self.word(ids)  # [T, hidden]
        mask = None
        if self.word_adapters is not None:
            # each token's adapter as ones on its rank columns [T, adapters * rank]: the same shapes for
            # every batch of a size, whatever its mix of tasks (CUDA graphs replay it)
            mask = adapter_mask(batch.adapters, len(self.adapter_names), self.rank, x.dtype)
            x = x + self.word_adapters(ids, mask)
        if self.token_type is not None:
            x = x + self.token_type.weight[0]
            if self.type_adapters is not None and mask is not None:
                x = x + self.type_adapters(torch.zeros_like(ids), mask)
        x = self.norm(x)
        rope = self.rotary(batch.positions)
        for layer in self.layers:
            x = layer(x, rope, attention, ops, mask)
        return x

    def layer_masks(self) -> list[AttnMask]:
        return [FULL] * self.spec.num_layers

    def score(self, hidden: torch.Tensor, batch) -> torch.Tensor:
        raise AssertionError("JinaV3 classifiers are refused by spec()")

    def weight_names(self) -> dict[str, list[str]]:
        lora = bool(self.adapter_names)
        names: dict[str, list[str]] = {"norm.weight": ["emb_ln.weight"], "norm.bias": ["emb_ln.bias"]}

        def adapted(ours: str, theirs: str, adapters: str) -> None:
            """Our layer ``ours``'s weight from the checkpoint's ``theirs``; where the config lists
            adapters, its stacked pairs into our ``adapters`` module."""
            if not lora:
                names[f"{ours}.weight"] = [f"{theirs}.weight"]
                return
            names[f"{ours}.weight"] = [f"{theirs}.parametrizations.weight.original"]
            names[f"{adapters}.a"] = [f"{theirs}.parametrizations.weight.0.lora_A"]
            names[f"{adapters}.b"] = [f"{theirs}.parametrizations.weight.0.lora_B"]

        adapted("word", "embeddings.word_embeddings", "word_adapters")
        if self.token_type is not None:
            adapted("token_type", "embeddings.token_type_embeddings", "type_adapters")
        for i in range(self.spec.num_layers):
            hf, ours = f"encoder.layers.{i}.", f"layers.{i}."
            for mine, theirs in _LINEARS.items():
                adapted(f"{ours}{mine}", f"{hf}{theirs}", f"{ours}adapters.{mine}")
                names[f"{ours}{mine}.bias"] = [f"{hf}{theirs}.bias"]
            for kind in ("weight", "bias"):
                names[f"{ours}attn_norm.{kind}"] = [f"{hf}norm1.{kind}"]
                names[f"{ours}mlp_norm.{kind}"] = [f"{hf}norm2.{kind}"]
        return names

    def weight_tensor(self, ours: str, tensor: torch.Tensor) -> torch.Tensor:
        embedding = ours.startswith(("word_adapters.", "type_adapters."))
        if not (embedding or ".adapters." in ours):
            return tensor
        # the published stacks [adapter, ...] as layers/lora.py's: adapter i's rank rows / columns at i * r
        first = ours.endswith(".a")
        target = self.get_parameter(ours).shape
        n, r = len(self.adapter_names), self.rank
        if embedding:  # A [n, vocab, r] -> [vocab, n * r]; B [n, r, dim] -> [n * r, dim]
            expected = (n, target[0], r) if first else (n, r, target[1])
        else:  # A [n, r, in] -> [n * r, in]; B [n, out, r] -> [out, n * r]
            expected = (n, r, target[1]) if first else (n, target[0], r)
        if tuple(tensor.shape) != expected:
            raise ConfigError(
                f"task adapter tensor {self.weight_names()[ours][0]!r} has shape {tuple(tensor.shape)}, "
                f"expected {expected} ({n} lora_adaptations of lora_rank {r})"
            )
        t = tensor.float()
        if first:
            return t.permute(1, 0, 2).reshape(-1, n * r) if embedding else t.reshape(n * r, -1)
        return (t.reshape(n * r, -1) if embedding else t.permute(1, 0, 2).reshape(-1, n * r)) * self.scale
