"""LLM rerankers (a causal LM + sentence-transformers' LogitScore) against ``CrossEncoder.predict``: tiny
random checkpoints of each decoder family saved as CrossEncoder folders, pairs through our tokenizer and
one packed engine batch, the raw logit (logit["yes"] - logit["no"]) equal within 1e-4 in fp32."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors import safe_open

from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.engine.models.registry import spec_from_folder
from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.load import load_model_info
from tests.support.corpus import mixed_texts
from tests.support.tiny_llm_rerankers import MAX_LENGTH, build_llm_reranker, reference
from tests.support.tiny_models import DECODERS

TOLERANCE = 1e-4  # fp32 on CPU; the packed forward differs from transformers' padded one in summation order


def _pairs() -> list[tuple[str, str]]:
    """Short queries with passages and whole documents: some pairs cut at the model's 256 tokens."""
    texts = mixed_texts(16)
    return [(texts[i], texts[(i * 5 + 3) % 16]) for i in range(16)]


def _engine_logits(info, pairs: list[tuple[str, str]]) -> tuple[np.ndarray, list[list[int]]]:
    ids, _ = TextEncoder(info).encode_pairs(pairs)  # segment ids, if any, are ignored by decoders
    cu = np.zeros(len(ids) + 1, np.int32)
    cu[1:] = np.cumsum([len(s) for s in ids])
    flat = np.concatenate([np.asarray(s, np.int32) for s in ids])
    return Engine(info, "cpu").embed(flat, cu)[:, 0], ids


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x.astype(np.float64)))


@pytest.mark.parametrize("family", DECODERS)
def test_scores_equal_cross_encoder(tmp_path, family):
    folder = build_llm_reranker(tmp_path, family)
    model, pairs = reference(folder), _pairs()
    info = load_model_info(str(folder))
    yes, no = (model.tokenizer.convert_tokens_to_ids(t) for t in ("yes", "no"))
    assert (info.task, info.dim, info.score_tokens, info.score_activation) == ("score", 1, (yes, no), "sigmoid")
    got, ids = _engine_logits(info, pairs)
    assert any(len(s) == MAX_LENGTH for s in ids) and any(len(s) < MAX_LENGTH for s in ids)  # cut and whole pairs
    want = model.predict(pairs, activation_fn=torch.nn.Identity(), batch_size=8)
    np.testing.assert_allclose(got, want, atol=TOLERANCE)
    assert np.ptp(want) > 0.1  # the scores differ, so the comparison means something
    # the default score: sigmoid of the logit, as the scorer applies it
    np.testing.assert_allclose(_sigmoid(got), model.predict(pairs, batch_size=8), atol=1e-5)


def test_tied_head_with_the_true_token_alone(tmp_path):
    """Tied embeddings (no lm_head.weight saved: the head's row comes from embed_tokens) and a LogitScore
    without a false token (the score is logit["yes"] itself)."""
    folder = build_llm_reranker(tmp_path, "qwen3", tied=True, true_only=True)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        assert "lm_head.weight" not in f.keys()  # noqa: SIM118 (safe_open is no mapping)
    model, pairs = reference(folder), _pairs()
    info = load_model_info(str(folder))
    assert info.score_tokens == (model.tokenizer.convert_tokens_to_ids("yes"),)
    got, _ = _engine_logits(info, pairs)
    want = model.predict(pairs, activation_fn=torch.nn.Identity(), batch_size=8)
    np.testing.assert_allclose(got, want, atol=TOLERANCE)
    assert np.ptp(want) > 0.1


def test_the_folder_prompt_and_a_structured_template(tmp_path):
    """A default prompt (a system message: the template's instruction) in a template that reads typed
    content parts; without a chat template, pairs are text pairs and the prompt prefixes the query."""
    from tests.support.tiny_llm_rerankers import STRUCTURED_TEMPLATE

    pairs = _pairs()
    for kwargs in ({"template": STRUCTURED_TEMPLATE, "prompt": "Find the answer"}, {"template": None, "prompt": "Q: "}):
        folder = build_llm_reranker(tmp_path, "qwen3", **kwargs)
        info = load_model_info(str(folder))
        assert info.message_format == ("structured" if kwargs["template"] else "flat")
        got, _ = _engine_logits(info, pairs)
        want = reference(folder).predict(pairs, activation_fn=torch.nn.Identity(), batch_size=8)
        np.testing.assert_allclose(got, want, atol=TOLERANCE)


def test_a_missing_lm_head_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = build_llm_reranker(tmp_path, "qwen3")
    weights = folder / "model.safetensors"
    save_file({k: v for k, v in load_file(weights).items() if k != "lm_head.weight"}, weights)
    with pytest.raises(ConfigError, match=r"lm_head.weight"):
        Engine(load_model_info(str(folder)), "cpu")


def test_a_family_without_llm_reranking_is_refused(tmp_path):
    folder = build_llm_reranker(tmp_path, "qwen3")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps({**config, "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"]})
    )
    with pytest.raises(ConfigError, match="Gemma3 causal LMs are not served as LLM rerankers"):
        spec_from_folder(load_model_info(str(folder)))
    shutil.rmtree(folder)
