"""NomicBERT folders (tiny random NomicBertModel checkpoints saved by transformers, in sentence-transformers
modules) through the tokenizer and one packed engine batch of texts of many lengths: vectors equal to
sentence-transformers' (cosine >= 0.9999 in fp32) with the folder's task prompts and Matryoshka
truncation; the published config's GPT-2 names, interleaved rotary pairs, and clear refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from embedfleet.services.gpu_worker.engine.models.registry import spec_from_folder
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.load import load_model_info
from tests.conftest import cosines
from tests.support.corpus import mixed_texts
from tests.support.engine_folders import edit_config, engine_vectors
from tests.support.tiny_models import build

HEADS, HEAD_DIM = 4, 16  # the tiny model's


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return build("nomic_bert", tmp_path_factory.mktemp("nomic"))


@pytest.fixture(scope="module")
def reference(folder):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


def _texts() -> list[str]:
    return mixed_texts(16)  # queries to whole documents: some cut at the model's 256 tokens


@pytest.mark.parametrize("prompt_name", ["query", "document"])
def test_nomic_bert_vectors_equal_sentence_transformers(folder, reference, prompt_name):
    texts = _texts()
    got = engine_vectors(folder, texts, prompt_name)
    want = reference.encode(texts, prompt_name=prompt_name)
    assert cosines(got, want).min() >= 0.9999
    assert cosines(got, reference.encode(texts)).min() < 0.9999  # the prompt changed the vectors


def test_matryoshka_dimensions_are_sentence_transformers_truncate_dim(folder, reference):
    texts = _texts()
    got = engine_vectors(folder, texts, "query", dimensions=32)
    want = reference.encode(texts, prompt_name="query", truncate_dim=32, normalize_embeddings=True)
    assert got.shape == (16, 32)
    assert cosines(got, want).min() >= 0.9999


def test_published_config_names(folder, reference, tmp_path):
    """nomic-embed-text-v1.5's config.json says n_embd, n_head, ..., activation_function "swiglu" and
    rotary_emb_base: the same model."""
    published = shutil.copytree(folder, tmp_path / "published")
    config = json.loads((published / "config.json").read_text())
    edit_config(
        published,
        architectures=["NomicBertModel"],
        n_embd=config["hidden_size"],
        n_head=config["num_attention_heads"],
        n_layer=config["num_hidden_layers"],
        n_inner=config["intermediate_size"],
        n_positions=config["max_position_embeddings"],
        layer_norm_epsilon=config["layer_norm_eps"],
        activation_function="swiglu",
        rotary_emb_base=1000.0,
        rotary_emb_fraction=1.0,
        rotary_emb_interleaved=False,
        rotary_scaling_factor=None,
        qkv_proj_bias=False,
        mlp_fc1_bias=False,
        mlp_fc2_bias=False,
        prenorm=False,
        hidden_size=None,
        num_attention_heads=None,
        num_hidden_layers=None,
        intermediate_size=None,
        max_position_embeddings=None,
        layer_norm_eps=None,
        hidden_act=None,
        rope_parameters=None,
    )
    texts = _texts()
    assert cosines(engine_vectors(published, texts), reference.encode(texts)).min() >= 0.9999


def _interleave(w: torch.Tensor) -> torch.Tensor:
    """Rows [x_0 .. x_{d/2-1}, y_0 .. y_{d/2-1}] of each head as [x_0, y_0, x_1, y_1, ...]."""
    heads = w.view(HEADS, 2, HEAD_DIM // 2, -1)  # [heads, halves, d/2, in]
    return heads.transpose(1, 2).reshape(w.shape)


def test_interleaved_rotary_pairs(folder, reference, tmp_path):
    """rotary_emb_interleaved: each head's pairs (2i, 2i + 1) rotate together. A checkpoint whose q and
    k rows are laid out so, read with the flag, is the rotate-half model sentence-transformers runs."""
    interleaved = shutil.copytree(folder, tmp_path / "interleaved")
    tensors = load_file(interleaved / "model.safetensors")
    for name in [n for n in tensors if n.endswith("attn.Wqkv.weight")]:
        q, k, v = tensors[name].chunk(3)
        tensors[name] = torch.cat([_interleave(q), _interleave(k), v]).contiguous()
    save_file(tensors, interleaved / "model.safetensors")
    texts = _texts()
    want = reference.encode(texts)
    edit_config(interleaved, rotary_emb_interleaved=True)
    assert cosines(engine_vectors(interleaved, texts), want).min() >= 0.9999
    edit_config(interleaved, rotary_emb_interleaved=False)
    assert cosines(engine_vectors(interleaved, texts), want).min() < 0.999  # the layout matters


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"rotary_emb_fraction": 0.5}, "rotary_emb_fraction != 1 is not supported"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1000.0}}, "rope type 'yarn'"),
        ({"prenorm": True}, "prenorm: true is not supported"),
        ({"activation_function": "glu"}, "activation 'glu' is not supported"),
        ({"rotary_scaling_factor": 2.0}, r"rotary_scaling_factor \(dynamic NTK scaling\) is not supported"),
    ],
)
def test_nomic_bert_refuses_what_it_does_not_implement(folder, tmp_path, changes, message):
    refused = shutil.copytree(folder, tmp_path / "refused")
    edit_config(refused, **changes)
    with pytest.raises(ConfigError, match=message):
        spec_from_folder(load_model_info(str(refused)))
