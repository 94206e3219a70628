"""Every family's packed forward against transformers' own implementation: tiny random models,
sequences of varied lengths in one packed batch (past the sliding windows), every token's state."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from embedfleet.services.gpu_worker.engine.attention import SdpaVarlen
from embedfleet.services.gpu_worker.engine.batch import DeviceBatch, prepare
from embedfleet.services.gpu_worker.engine.linear import select_linear_ops
from embedfleet.services.gpu_worker.engine.loader import load_weights
from embedfleet.services.gpu_worker.engine.models.registry import family_for

LENGTHS = [1, 5, 19, 40, 7, 40, 26]  # windows below are 8-12 tokens: most sequences pass them


def _randomize(model: torch.nn.Module) -> None:
    """transformers' init (std 0.02) makes every token's state nearly alike: scale up, so a wrong
    mask or position shows."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(
                    0.1 * torch.randn(p.shape, generator=gen)
                    + (1.0 if "norm" in name.lower() and "gemma" not in type(model).__name__.lower() else 0.0)
                )
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=gen))


def _configs():
    from transformers import (
        Gemma2Config,
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        ModernBertConfig,
        MPNetConfig,
        Qwen2Config,
        Qwen3Config,
    )

    small = dict(vocab_size=300, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96)
    decoder = dict(small, num_key_value_heads=2, max_position_embeddings=256)
    return {
        "mpnet": MPNetConfig(**small, max_position_embeddings=130, relative_attention_num_buckets=32),
        "modernbert": ModernBertConfig(
            **small,
            local_attention=16,
            global_attn_every_n_layers=2,
            max_position_embeddings=256,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            cls_token_id=1,
            sep_token_id=2,
        ),
        "qwen3": Qwen3Config(**decoder, head_dim=32, rope_theta=1e6),
        "qwen2": Qwen2Config(**decoder, rope_theta=1e6),
        "mistral": MistralConfig(**decoder, sliding_window=12),
        "llama": LlamaConfig(
            **decoder,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
        "gemma3": Gemma3TextConfig(
            **dict(decoder, num_key_value_heads=1, num_hidden_layers=4),
            head_dim=32,
            sliding_window=9,
            query_pre_attn_scalar=24,
            use_bidirectional_attention=True,
            layer_types=["sliding_attention", "full_attention"] * 2,
        ),
        # a cap of 2 bends most scores (50, the real one, would leave these near linear); layer_types
        # left to the config's default (sliding, full, sliding)
        "gemma2": Gemma2Config(
            **decoder, head_dim=32, sliding_window=9, query_pre_attn_scalar=24, attn_logit_softcapping=2.0
        ),
    }


def _hf_model(name: str, config):
    from transformers import AutoModel

    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation="eager").eval()
    _randomize(model)
    return model


def _hf_states(model, ids: list[np.ndarray], pad: int, mask_4d: bool = False) -> list[torch.Tensor]:
    width = max(len(s) for s in ids)
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, s in enumerate(ids):
        input_ids[i, : len(s)] = torch.from_numpy(s)
        mask[i, : len(s)] = 1
    kwargs = {}
    if mask_4d:  # bidirectional decoder: an explicit [B, 1, L, L] mask (transformers' decoders are causal)
        keep = mask[:, None, None, :].bool() & mask[:, None, :, None].bool()
        kwargs["attention_mask"] = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
    else:
        kwargs["attention_mask"] = mask
    with torch.no_grad():
        hidden = model(input_ids=input_ids, **kwargs).last_hidden_state
    return [hidden[i, : len(s)] for i, s in enumerate(ids)]


def _packed_forward(config: dict, hf_model, ids: list[np.ndarray]):
    """Our model of the family, with the transformers model's weights, on ``ids`` packed into one
    batch: (the model, hidden states [T, hidden], the batch)."""
    spec = family_for(config).spec(config)
    model = family_for(config).model(spec).eval()
    load_weights(model, dict(hf_model.state_dict()))
    cu = np.concatenate([[0], np.cumsum([len(s) for s in ids])]).astype(np.int32)
    host = prepare(np.concatenate(ids), cu, spec.position_offset)
    batch = DeviceBatch(host, torch.device("cpu"))
    attention = SdpaVarlen()
    attention.bind(host.cu_seqlens, batch.cu_seqlens, host.max_len)
    with torch.no_grad():
        return model, model(batch, attention, select_linear_ops(torch.device("cpu"), torch.float32)), batch


def _ours(config: dict, hf_model, ids: list[np.ndarray]) -> list[torch.Tensor]:
    _, hidden, batch = _packed_forward(config, hf_model, ids)
    cu = batch.cu_seqlens.tolist()
    return [hidden[s:e] for s, e in itertools.pairwise(cu)]


DECODERS = ("qwen3", "qwen2", "mistral", "llama")
CASES = [(name, False) for name in ("mpnet", "modernbert", *DECODERS, "gemma3", "gemma2")] + [
    (name, True) for name in DECODERS
]


@pytest.mark.parametrize("name, bidirectional", CASES)
def test_packed_forward_equals_transformers(name, bidirectional):
    config = _configs()[name]
    hf = _hf_model(name, config)
    raw = config.to_dict()
    if bidirectional:
        # the reference is given a full bidirectional mask: no window
        raw.update(is_causal=False, use_bidirectional_attention=True, sliding_window=None)
    rng = np.random.default_rng(1)
    ids = [rng.integers(3, 300, size=n).astype(np.int32) for n in LENGTHS]
    got = _ours(raw, hf, ids)
    want = _hf_states(hf, ids, pad=0, mask_4d=bidirectional)
    for i, (g, w) in enumerate(zip(got, want)):
        assert w.abs().max() > 0.1  # not a degenerate model
        torch.testing.assert_close(
            g, w, atol=2e-4, rtol=2e-4, msg=lambda m, i=i: f"sequence {i} (length {LENGTHS[i]}): {m}"
        )


CLASSIFIERS = ["mpnet", "modernbert-cls", "modernbert-mean", "qwen3", "llama"]


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_sequence_classifier_logits_equal_transformers(name):
    """Cross-encoders / rerankers of the families: the engine's logits equal transformers' within 1e-4."""
    from transformers import AutoModelForSequenceClassification

    family = name.split("-")[0]
    config = _configs()[family]
    config.num_labels = 3
    config.pad_token_id = 0
    if family == "modernbert":
        config.classifier_pooling = name.split("-")[1]
    torch.manual_seed(0)
    hf = AutoModelForSequenceClassification.from_config(config, attn_implementation="eager").eval()
    _randomize(hf)
    raw = dict(hf.config.to_dict(), architectures=[type(hf).__name__])  # as save_pretrained writes it
    rng = np.random.default_rng(2)
    ids = [rng.integers(3, 300, size=n).astype(np.int32) for n in LENGTHS]
    model, hidden, batch = _packed_forward(raw, hf, ids)
    with torch.no_grad():
        got = model.score(hidden, batch)
    width = max(LENGTHS)
    input_ids = torch.zeros((len(ids), width), dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, s in enumerate(ids):
        input_ids[i, : len(s)], mask[i, : len(s)] = torch.from_numpy(s), 1
    with torch.no_grad():
        want = hf(input_ids=input_ids, attention_mask=mask).logits
    assert want.std() > 0.05  # logits that differ between inputs
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
