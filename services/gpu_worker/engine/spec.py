"""Model architecture hyper-parameters, read from a Hugging Face config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from shared.config import ConfigError

# model_type -> position ids start at (pad_token_id + 1) instead of 0
_OFFSET_POSITIONS = {"xlm-roberta", "roberta", "camembert"}
SUPPORTED_TYPES = {"bert", *_OFFSET_POSITIONS}
ACTIVATIONS = {"gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu"}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    model_type: str
    hidden_size: int
    num_heads: int
    num_layers: int
    intermediate_size: int
    vocab_size: int
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float
    activation: str
    position_offset: int  # first position id (0 for BERT, pad_token_id + 1 for RoBERTa)
    num_labels: int = 0  # > 0: a cross-encoder with a classification head over the first token

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_folder(cls, path: Path) -> ModelSpec:
        config = json.loads((path / "config.json").read_text())
        model_type = config.get("model_type", "bert")
        if model_type not in SUPPORTED_TYPES:
            raise ConfigError(f"model_type {model_type!r} is not supported (supported: {sorted(SUPPORTED_TYPES)})")
        activation = config.get("hidden_act", "gelu")
        if activation not in ACTIVATIONS:
            raise ConfigError(f"hidden_act {activation!r} is not supported (supported: {sorted(ACTIVATIONS)})")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ConfigError("only absolute position embeddings are supported")
        spec = cls(
            model_type=model_type,
            hidden_size=int(config["hidden_size"]),
            num_heads=int(config["num_attention_heads"]),
            num_layers=int(config["num_hidden_layers"]),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            max_positions=int(config["max_position_embeddings"]),
            type_vocab_size=int(config.get("type_vocab_size", 2)),
            layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
            activation=activation,
            position_offset=int(config.get("pad_token_id", 1)) + 1 if model_type in _OFFSET_POSITIONS else 0,
            num_labels=_labels(config),
        )
        if spec.hidden_size % spec.num_heads:
            raise ConfigError("hidden_size is not a multiple of num_attention_heads")
        return spec


def _labels(config: dict) -> int:
    if not any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or []):
        return 0
    return int(config.get("num_labels") or len(config.get("id2label") or {}) or 1)
