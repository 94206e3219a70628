"""NomicBERT (nomic-embed-text-v1 / v1.5, snowflake-arctic-embed-m-long): GTE's encoder (gte.py)
without biases, a SwiGLU MLP (``fc12`` the gate, ``fc11`` the up projection), the embeddings' norm
``emb_ln``; rotary base ``rotary_emb_base``, pairs interleaved where ``rotary_emb_interleaved``.
The mixture-of-experts variant (nomic-embed-text-v2-moe) is refused.

Published configs use GPT-2's names (n_embd, n_head, n_layer, n_inner, n_positions,
layer_norm_epsilon, activation_function "swiglu"); transformers 5's NomicBertConfig uses BERT's and
``rope_parameters``. Both are read.
"""

from __future__ import annotations

from typing import Any

import torch

from embedfleet.services.gpu_worker.engine.layers.rotary import rope_parameters
from embedfleet.services.gpu_worker.engine.models.gte import GteEncoder
from embedfleet.services.gpu_worker.engine.spec import ModelSpec
from embedfleet.shared.config import ConfigError

_ACTIVATIONS = {"swiglu": "silu", "silu": "silu", "geglu": "gelu", "gelu": "gelu"}


def _get(config: dict[str, Any], *names: str, default: Any = None) -> Any:
    return next((config[n] for n in names if config.get(n) is not None), default)


def spec(config: dict[str, Any]) -> ModelSpec:
    if _get(config, "num_experts", default=0) or _get(config, "moe_every_n_layers", default=0):
        raise ConfigError("NomicBERT mixture-of-experts layers (nomic-embed-text-v2-moe) are not served yet")
    if any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or []):
        raise ConfigError("NomicBERT sequence classifiers are not served yet; NomicBERT embedders are")
    for flag in ("prenorm", "qkv_proj_bias", "mlp_fc1_bias", "mlp_fc2_bias", "use_rms_norm"):
        if config.get(flag):
            raise ConfigError(f"NomicBERT {flag}: true is not supported")
    if float(_get(config, "rotary_emb_fraction", default=1.0)) != 1.0:
        raise ConfigError("NomicBERT rotary_emb_fraction != 1 is not supported")
    act = str(_get(config, "activation_function", "hidden_act", default="swiglu"))
    if act not in _ACTIVATIONS:
        raise ConfigError(f"NomicBERT activation {act!r} is not supported (supported: {', '.join(_ACTIVATIONS)})")
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
        activation=_ACTIVATIONS[act],
        config=config,
    )


class NomicBertEncoder(GteEncoder):
    PREFIXES = ("", "nomic_bert.", "bert.")
    BIASES = False
    TYPE_VOCAB = 2

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.interleaved = bool(spec.config.get("rotary_emb_interleaved", False))

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
        for i in range(self.spec.num_layers):
            hf, ours = f"encoder.layers.{i}.", f"layers.{i}."
            names[f"{ours}qkv.weight"] = [f"{hf}attn.Wqkv.weight"]
            names[f"{ours}attn_out.weight"] = [f"{hf}attn.out_proj.weight"]
            names[f"{ours}mlp.gate_up.weight"] = [f"{hf}mlp.fc12.weight", f"{hf}mlp.fc11.weight"]  # [gate; up]
            names[f"{ours}mlp.down.weight"] = [f"{hf}mlp.fc2.weight"]
            for kind in ("weight", "bias"):
                names[f"{ours}attn_norm.{kind}"] = [f"{hf}norm1.{kind}"]
                names[f"{ours}mlp_norm.{kind}"] = [f"{hf}norm2.{kind}"]
        return names

    def weight_tensor(self, ours: str, tensor: torch.Tensor) -> torch.Tensor:
        if not (self.interleaved and ours.endswith(".qkv.weight")):
            return tensor
        # rotary_emb_interleaved rotates the pairs (2i, 2i + 1) of each head; Rotary rotates (i, i + d/2).
        # The same reordering of q's and k's rows within each head leaves q.k unchanged and turns the
        # one into the other: [even rows; odd rows] per head
        d = self.spec.head_dim
        order = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
        q, k, v = tensor.view(3, self.spec.num_heads, d, -1).unbind(0)
        return torch.cat([q[:, order], k[:, order], v]).reshape(tensor.shape)
