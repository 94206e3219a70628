"""EuroBERT (EuroBERT-210m / 610m / 2.1B; model_type eurobert): a bidirectional Llama. Pre-norm blocks
with RMSNorm (``input_layernorm``, ``post_attention_layernorm``), grouped-query attention over rotary
positions (rope_theta 250000 in the published configs), a SwiGLU MLP, a final ``norm``; no embedding
scaling, q/k/v/o biases only with ``attention_bias``, MLP biases only with ``mlp_bias``. Every layer
attends to the whole sequence (transformers builds a bidirectional mask, whatever ``sliding_window``
or ``is_causal`` the config carries). Checkpoints hold the encoder under ``model.`` (EuroBertForMaskedLM,
the published ones) or bare (EuroBertModel, as sentence-transformers saves it): decoder.py's names.

Served as decoder.py's model with every layer's mask bidirectional. The sequence classifier
(EuroBertForSequenceClassification: dense + GELU + classifier over the ``classifier_pooling`` of
bos / mean / late tokens) is refused."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from embedfleet.services.gpu_worker.engine.attention import AttnMask
from embedfleet.services.gpu_worker.engine.layers.rotary import inv_frequencies, rope_parameters
from embedfleet.services.gpu_worker.engine.models import decoder
from embedfleet.services.gpu_worker.engine.spec import ModelSpec, num_labels
from embedfleet.shared.config.option import ConfigError


def spec(config: dict[str, Any]) -> ModelSpec:
    if num_labels(config):
        raise ConfigError(
            "EuroBERT sequence classifiers (a dense + GELU head over classifier_pooling's tokens) are not "
            "served; EuroBERT embedders are"
        )
    out = replace(decoder.spec(config), causal=False)
    inv_frequencies(rope_parameters(config), out.head_dim)  # a rope type not implemented: refused here, for check too
    return out


class EuroBertEncoder(decoder.DecoderEncoder):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        # transformers' EuroBertModel reads no window: every layer sees the whole sequence
        self.layer_mask = [AttnMask(causal=False)] * spec.num_layers
