"""Model architecture hyper-parameters common to every family, read from a Hugging Face config.json.

The family (``models.registry``) decides how its config's names map to these fields; what only one
family needs stays in the raw ``config`` and is read by that family's model file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from embedfleet.shared.model_dir.scoring import classifier_labels

ACTIVATIONS = {"gelu", "gelu_new", "gelu_pytorch_tanh", "quick_gelu", "relu", "silu", "swish"}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    model_type: str
    family: str  # the registry's family name ("BERT", "Qwen3", ...)
    hidden_size: int
    num_heads: int
    num_layers: int
    intermediate_size: int
    vocab_size: int
    max_positions: int  # position ids the model has (its limit is max_positions - position_offset)
    layer_norm_eps: float
    activation: str
    position_offset: int = 0  # first position id (0; pad_token_id + 1 for RoBERTa and MPNet)
    type_vocab_size: int = 1  # segment ids the model embeds (BERT: 2; others ignore them: 1)
    num_labels: int = 0  # > 0: a sequence classifier (cross-encoder / reranker) with that many logits
    num_kv_heads: int = 0  # 0: as many as query heads
    head_dim_override: int = 0  # 0: hidden_size / num_heads (Qwen3 and Gemma3 set their own)
    causal: bool = False  # decoders: each token sees only the tokens before it
    # an LLM reranker (num_labels 1): the LM head's rows scored at the last token, (true,) or (true, false)
    score_tokens: tuple[int, ...] = ()
    projection_dim: int = 0  # > 0: the pooled vector is projected to this size (CLIP's text_projection)
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # the raw config.json

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden_size // self.num_heads

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads


def num_labels(config: dict) -> int:
    """Logits of a ``…ForSequenceClassification`` checkpoint; 0 for anything else."""
    if not any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or []):
        return 0
    return classifier_labels(config)
