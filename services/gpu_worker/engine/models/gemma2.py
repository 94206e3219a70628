"""Gemma2 (bge-multilingual-gemma2): Gemma3's block without its per-head q/k norms — embeddings scaled
by sqrt(hidden), RMSNorms (scales stored as w - 1) before and after attention and MLP, grouped-query
attention scaled by query_pre_attn_scalar, GeGLU-tanh MLP, one rope base — causal, with a sliding
window on alternate layers and the attention scores soft-capped: cap * tanh(score / cap) before the
softmax. No fused kernel caps scores, so Gemma2 runs SDPA's explicit path (no CUDA graphs).
The final logit soft-capping belongs to the LM head: an embedding never reaches it."""

from __future__ import annotations

from typing import Any

from torch import nn

from embedfleet.services.gpu_worker.engine.attention import AttnMask
from embedfleet.services.gpu_worker.engine.layers.rotary import Rotary, rope_parameters
from embedfleet.services.gpu_worker.engine.models import gemma3
from embedfleet.services.gpu_worker.engine.models.gemma3 import FULL, SLIDING
from embedfleet.services.gpu_worker.engine.spec import ModelSpec
from embedfleet.shared.config.option import ConfigError

SOFTCAP = 50.0  # transformers' attn_logit_softcapping when config.json has none


def spec(config: dict[str, Any]) -> ModelSpec:
    if config.get("use_bidirectional_attention") or config.get("is_causal") is False:
        raise ConfigError("a bidirectional Gemma2 is not served (Gemma2 embedders attend causally)")
    return gemma3.spec(config)


class Gemma2Encoder(gemma3.Gemma3Encoder):
    QK_NORM = False
    PATTERN = 2  # without layer_types: sliding, full, sliding, full, …

    def rotaries(self, spec: ModelSpec) -> nn.ModuleDict:
        rotary = Rotary(rope_parameters(spec.config), spec.head_dim)  # one table for both layer types
        return nn.ModuleDict({FULL: rotary, SLIDING: rotary})

    def attn_masks(self, spec: ModelSpec) -> dict[str, AttnMask]:
        c = spec.config
        scale = float(c.get("query_pre_attn_scalar") or spec.head_dim) ** -0.5
        cap = c.get("attn_logit_softcapping", SOFTCAP)
        softcap = float(cap) if cap else None
        # causal sliding layers: key j seen where i - sliding_window < j <= i
        window = int(c.get("sliding_window") or 4096) - 1
        return {
            FULL: AttnMask(causal=True, scale=scale, softcap=softcap),
            SLIDING: AttnMask(causal=True, window=window, scale=scale, softcap=softcap),
        }
