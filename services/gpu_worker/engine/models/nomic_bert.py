"""NomicBERT (nomic-embed-text-v1 / v1.5, snowflake-arctic-embed-m-long, nomic-embed-text-v2-moe): GTE's
encoder (gte.py) with the embeddings' norm ``emb_ln``, rotary base ``rotary_emb_base``, pairs
interleaved where ``rotary_emb_interleaved``. v1 has no biases and a SwiGLU MLP (``fc12`` the gate,
``fc11`` the up projection); v2-moe has biases, a plain GELU MLP, and a mixture of experts
(layers/moe.py) in place of the MLP on every other layer.

Published configs use GPT-2's names (n_embd, n_head, n_layer, n_inner, n_positions,
layer_norm_epsilon, activation_function "swiglu"); transformers 5's NomicBertConfig uses BERT's and
``rope_parameters``. Both are read.

nomic-embed-text-v2-moe as published (nomic's modeling_hf_nomic_bert.py, which its config's auto_map
names; contrastors' Block and NomicBertEncoder, where it was trained; vLLM's NomicMoE):
- config: n_embd 768, n_head 12, n_layer 12, n_inner 3072, n_positions 2048, vocab_size 250048
  (XLM-R's SentencePiece vocabulary padded to a multiple of 64), type_vocab_size 1, layer_norm_epsilon
  1e-5, rotary_emb_base 10000, activation_function "gelu", qkv_proj_bias / mlp_fc1_bias / mlp_fc2_bias
  true, prenorm false; num_experts 8, moe_top_k 2, moe_every_n_layers 2, moe_normalize_expert_weights
  false, moe_impl "megablocks", expert_choice_router false, num_shared_experts 0, ffn_div 1; and
  router_aux_loss_coef, moe_resid_pdrop, which only training reads.
- layer i is a mixture of experts where i % moe_every_n_layers == 1 (layers 1, 3, ..., 11); an n of 0
  or 1 makes none.
- activation_function "gelu" is a plain MLP, fc1 -> exact (erf) GELU -> fc2; only "swiglu" and "geglu"
  are gated. qkv_proj_bias puts a bias on Wqkv and out_proj, mlp_fc1_bias on fc1 (fc11 and fc12),
  mlp_fc2_bias on fc2.
- a mixture-of-experts layer: ``mlp.router.layer.weight`` [E, H] (no bias), softmax over the experts
  in float32, the top moe_top_k, their probabilities not renormalised; ``mlp.experts.mlp.w1`` and
  ``mlp.experts.mlp.w2``, each [E * n_inner, H] with expert e's rows at e * n_inner, expert e computing
  gelu(x @ w1[e]^T) @ w2[e] without biases; the outputs weighted and summed, then
  ``mlp.experts.bias`` [H] added once. The published moe_normalize_expert_weights (false) is not read
  by the inference code; other values are refused here.
- the block is v1's post-norm one (norm1 after attention, norm2 after the MLP), emb_ln after the
  word + token-type embeddings.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from embedfleet.services.gpu_worker.engine.layers.mlp import GatedMLP
from embedfleet.services.gpu_worker.engine.layers.moe import MoEMLP
from embedfleet.services.gpu_worker.engine.layers.rotary import rope_parameters
from embedfleet.services.gpu_worker.engine.linear import LinearOps, activation
from embedfleet.services.gpu_worker.engine.models.gte import GteEncoder
from embedfleet.services.gpu_worker.engine.spec import ModelSpec
from embedfleet.shared.config.option import ConfigError

# activation_function (published configs) -> (activation, gated): nomic's Block gates these two only
_PUBLISHED_ACTS = {"swiglu": ("silu", True), "geglu": ("gelu", True), "gelu": ("gelu", False)}
# hidden_act (transformers 5's NomicBertConfig, whose MLP is always gated)
_HF_ACTS = {"swiglu": "silu", "silu": "silu", "geglu": "gelu", "gelu": "gelu"}

# the mixture-of-experts options of the published configs: read, fixed at the value served, or training only
_MOE_READ = ("num_experts", "moe_top_k", "moe_every_n_layers")
_MOE_FIXED = {
    "moe_normalize_expert_weights": False,
    "expert_choice_router": False,
    "num_shared_experts": 0,
    "ffn_div": 1,
    "moe_impl": "megablocks",
}
_MOE_TRAINING = ("router_aux_loss_coef", "moe_resid_pdrop")  # a loss term and a dropout: no effect on a forward


def _get(config: dict[str, Any], *names: str, default: Any = None) -> Any:
    return next((config[n] for n in names if config.get(n) is not None), default)


def mlp_activation(config: dict[str, Any]) -> tuple[str, bool]:
    """(activation, gated) of the dense MLPs."""
    if config.get("activation_function") is not None:
        act = str(config["activation_function"])
        if act not in _PUBLISHED_ACTS:
            raise ConfigError(
                f"NomicBERT activation {act!r} is not supported (supported: {', '.join(_PUBLISHED_ACTS)})"
            )
        return _PUBLISHED_ACTS[act]
    act = str(config.get("hidden_act") or "swiglu")
    if act not in _HF_ACTS:
        raise ConfigError(f"NomicBERT activation {act!r} is not supported (supported: {', '.join(_HF_ACTS)})")
    return _HF_ACTS[act], True


def moe_shape(config: dict[str, Any]) -> tuple[int, int, int]:
    """(num_experts, top_k, every_n) of a mixture-of-experts config; (0, 0, 0) without experts."""
    experts = int(config.get("num_experts") or 0)
    if not experts:
        return 0, 0, 0
    known = (*_MOE_READ, *_MOE_FIXED, *_MOE_TRAINING)
    for key in config:
        if (key.startswith(("moe_", "router_")) or "expert" in key) and key not in known:
            raise ConfigError(
                f"NomicBERT mixture-of-experts option {key!r} is not supported (known: {', '.join(known)})"
            )
    for key, served in _MOE_FIXED.items():
        if config.get(key) is not None and config[key] != served:
            raise ConfigError(f"NomicBERT {key} {config[key]!r} is not supported (served: {served!r})")
    top_k, every_n = int(config.get("moe_top_k") or 1), int(config.get("moe_every_n_layers") or 0)
    if every_n < 2:
        raise ConfigError(
            f"NomicBERT num_experts with moe_every_n_layers {every_n} is not supported: the published code "
            "makes layer i a mixture of experts where i % moe_every_n_layers == 1, none for 0 or 1"
        )
    if not 1 <= top_k <= experts:
        raise ConfigError(f"NomicBERT moe_top_k {top_k} must be between 1 and num_experts {experts}")
    return experts, top_k, every_n


def spec(config: dict[str, Any]) -> ModelSpec:
    if any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or []):
        raise ConfigError("NomicBERT sequence classifiers are not served yet; NomicBERT embedders are")
    for flag in ("prenorm", "use_rms_norm"):
        if config.get(flag):
            raise ConfigError(f"NomicBERT {flag}: true is not supported")
    if float(_get(config, "rotary_emb_fraction", default=1.0)) != 1.0:
        raise ConfigError("NomicBERT rotary_emb_fraction != 1 is not supported")
    act, gated = mlp_activation(config)
    if moe_shape(config)[0] and gated:
        # contrastors trained gated experts with a third tensor (experts.mlp.v1) nomic's inference code never reads
        raise ConfigError(
            "NomicBERT mixture-of-experts layers with a gated activation "
            f"({_get(config, 'activation_function', 'hidden_act', default='swiglu')}) "
            "are not supported: the published ones are plain GELU MLPs"
        )
    if _get(config, "rotary_scaling_factor") is not None:
        # nomic's dynamic NTK: the rope base grows with the padded batch's longest sequence past
        # max_trained_positions (a vector would depend on its batch); transformers 5 ignores the key
        raise ConfigError(
            "NomicBERT rotary_scaling_factor (dynamic NTK scaling) is not supported: "
            "the published configs leave it null"
        )
    kind = rope_parameters(config)["rope_type"]
    if kind != "default":
        raise ConfigError(f"NomicBERT rope type {kind!r} is not supported (only unscaled rotary positions)")
    return ModelSpec(
        model_type="nomic_bert",
        family="NomicBERT",
        hidden_size=int(_get(config, "n_embd", "hidden_size")),
        num_heads=int(_get(config, "n_head", "num_attention_heads")),
        num_layers=int(_get(config, "n_layer", "num_hidden_layers")),
        intermediate_size=int(_get(config, "n_inner", "intermediate_size")),
        vocab_size=int(config["vocab_size"]),
        max_positions=int(_get(config, "n_positions", "max_position_embeddings", default=2048)),
        layer_norm_eps=float(_get(config, "layer_norm_epsilon", "layer_norm_eps", default=1e-12)),
        activation=act,
        config=config,
    )


class PlainMLP(nn.Module):
    """fc1 -> act -> fc2: activation_function "gelu" (v2-moe's dense layers)."""

    def __init__(self, hidden: int, intermediate: int, act: str, *, up_bias: bool, down_bias: bool) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, intermediate, bias=up_bias)
        self.down = nn.Linear(intermediate, hidden, bias=down_bias)
        activation(act)  # an unknown activation fails at build, not at the first batch
        self.act = act

    def forward(self, x: torch.Tensor, ops: LinearOps, residual: torch.Tensor) -> torch.Tensor:
        # x, residual: [T, hidden] -> residual + down(act(up(x))), the add fused into the down projection
        return ops.linear_add(ops.linear_act(x, self.up, self.act), self.down, residual)


class NomicBertEncoder(GteEncoder):
    PREFIXES = ("", "nomic_bert.", "bert.")
    BIASES = False  # GTE's blocks are built without; the config's bias flags add them below
    TYPE_VOCAB = 2

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        c, h, i = spec.config, spec.hidden_size, spec.intermediate_size
        self.interleaved = bool(c.get("rotary_emb_interleaved", False))
        act, gated = mlp_activation(c)
        up_bias, down_bias = bool(c.get("mlp_fc1_bias")), bool(c.get("mlp_fc2_bias"))
        experts, top_k, self.every_n = moe_shape(c)
        for n, layer in enumerate(self.layers):
            if c.get("qkv_proj_bias"):  # Wqkv and out_proj both
                layer.qkv, layer.attn_out = nn.Linear(h, 3 * h), nn.Linear(h, h)
            if self.is_moe(n):
                layer.mlp = MoEMLP(h, i, experts, top_k, act)
            elif not gated:
                layer.mlp = PlainMLP(h, i, act, up_bias=up_bias, down_bias=down_bias)
            elif up_bias or down_bias:
                layer.mlp = GatedMLP(h, i, act, bias=up_bias)
                layer.mlp.down = nn.Linear(i, h, bias=down_bias)

    def is_moe(self, layer: int) -> bool:
        return self.every_n > 0 and layer % self.every_n == 1

    def rope_parameters(self) -> dict[str, Any]:
        params = rope_parameters(self.spec.config, default_theta=1000.0)
        if "rotary_emb_base" in self.spec.config:
            params["rope_theta"] = float(self.spec.config["rotary_emb_base"])
        return params

    def weight_names(self) -> dict[str, list[str]]:
        names = {
            "word.weight": ["embeddings.word_embeddings.weight"],
            "norm.weight": ["emb_ln.weight"],
            "norm.bias": ["emb_ln.bias"],
        }
        if self.token_type is not None:
            names["token_type.weight"] = ["embeddings.token_type_embeddings.weight"]
        for i, layer in enumerate(self.layers):
            hf, ours = f"encoder.layers.{i}.", f"layers.{i}."
            # each of our parameters -> its checkpoint name (several: concatenated), weights and biases
            parts = {"qkv": ["attn.Wqkv"], "attn_out": ["attn.out_proj"], "attn_norm": ["norm1"], "mlp_norm": ["norm2"]}
            mlp = layer.mlp
            if isinstance(mlp, MoEMLP):
                names[f"{ours}mlp.router.weight"] = [f"{hf}mlp.router.layer.weight"]
                names[f"{ours}mlp.w1"] = [f"{hf}mlp.experts.mlp.w1"]  # [E * I, H]: see weight_tensor
                names[f"{ours}mlp.w2"] = [f"{hf}mlp.experts.mlp.w2"]
                names[f"{ours}mlp.bias"] = [f"{hf}mlp.experts.bias"]
            elif isinstance(mlp, PlainMLP):
                parts |= {"mlp.up": ["mlp.fc1"], "mlp.down": ["mlp.fc2"]}
            else:
                parts |= {"mlp.gate_up": ["mlp.fc12", "mlp.fc11"], "mlp.down": ["mlp.fc2"]}  # [gate; up]
            params = dict(layer.named_parameters())
            for part, theirs in parts.items():
                for kind in ("weight", "bias"):
                    if f"{part}.{kind}" in params:
                        names[f"{ours}{part}.{kind}"] = [f"{hf}{t}.{kind}" for t in theirs]
        return names

    def weight_tensor(self, ours: str, tensor: torch.Tensor) -> torch.Tensor:
        if ours.endswith((".mlp.w1", ".mlp.w2")):  # [E * I, H], expert e's rows at e * I: as [E, I, H]
            return tensor.reshape(-1, self.spec.intermediate_size, self.spec.hidden_size)
        if not (self.interleaved and ours.endswith((".qkv.weight", ".qkv.bias"))):
            return tensor
        # rotary_emb_interleaved rotates the pairs (2i, 2i + 1) of each head; Rotary rotates (i, i + d/2).
        # The same reordering of q's and k's rows within each head leaves q.k unchanged and turns the
        # one into the other: [even rows; odd rows] per head (a bias's entries alike)
        d = self.spec.head_dim
        order = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
        q, k, v = tensor.reshape(3, self.spec.num_heads, d, -1).unbind(0)
        return torch.cat([q[:, order], k[:, order], v]).reshape(tensor.shape)
