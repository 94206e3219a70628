"""EuroBERT folders (tiny random EuroBertModel checkpoints saved by transformers, in sentence-transformers
modules: mean pooling, Normalize, a query prompt) through the tokenizer and one packed engine batch of
texts of many lengths: vectors equal to sentence-transformers' (cosine >= 0.9999 in fp32) with the prompt
and Matryoshka truncation; the published checkpoints' form (EuroBertForMaskedLM under ``model.``, the
rope base as ``rope_theta``); every layer bidirectional whatever window the config names; refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from embedfleet.services.cli.check import check_folder
from embedfleet.services.gpu_worker.engine.models.registry import spec_from_folder
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.load import load_model_info
from tests.conftest import cosines
from tests.support.corpus import mixed_texts
from tests.support.engine_folders import edit_config, engine_vectors
from tests.support.tiny_models import build, st_reference

TEXTS = mixed_texts(16)  # queries to whole documents, some cut at the model's 256 tokens: one packed batch


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return build("eurobert", tmp_path_factory.mktemp("eurobert"))


@pytest.mark.parametrize("prompt_name", [None, "query"])
def test_eurobert_vectors_equal_sentence_transformers(folder, prompt_name):
    got = engine_vectors(folder, TEXTS, prompt_name)
    want = st_reference(folder, TEXTS, prompt_name)
    assert cosines(got, want).min() >= 0.9999
    assert cosines(got, got[::-1]).min() < 0.99  # different texts, clearly different vectors
    if prompt_name:
        assert cosines(got, engine_vectors(folder, TEXTS)).min() < 0.9999  # the prompt changed the vectors


def test_matryoshka_dimensions_are_the_leading_components_renormalised(folder):
    # sentence-transformers' truncate_dim: the first 32 components of its vector, then L2-normalised
    full = st_reference(folder, TEXTS, "query")[:, :32]
    want = full / np.linalg.norm(full, axis=1, keepdims=True)
    got = engine_vectors(folder, TEXTS, "query", dimensions=32)
    assert got.shape == (16, 32)
    assert cosines(got, want).min() >= 0.9999


def test_published_checkpoint_form(folder, tmp_path):
    """EuroBERT-210m as published: EuroBertForMaskedLM (the encoder under ``model.``, an LM head beside
    it) and a transformers-4 config (``rope_theta``, no rope_parameters): the same model."""
    published = shutil.copytree(folder, tmp_path / "published")
    tensors = load_file(published / "model.safetensors")
    prefixed = {f"model.{name}": t for name, t in tensors.items()}
    prefixed["lm_head.weight"] = tensors["embed_tokens.weight"].clone()
    save_file(prefixed, published / "model.safetensors")
    edit_config(published, architectures=["EuroBertForMaskedLM"], rope_parameters=None, rope_theta=250000.0)
    want = st_reference(folder, TEXTS)
    assert cosines(engine_vectors(published, TEXTS), want).min() >= 0.9999
    edit_config(published, rope_theta=10000.0)  # the base is read: another one gives other vectors
    assert cosines(engine_vectors(published, TEXTS), want).min() < 0.999


def test_every_layer_sees_the_whole_sequence(folder, tmp_path):
    """transformers' EuroBertModel builds a bidirectional mask whatever the config says of windows or
    causality: a config naming them gives the same vectors."""
    windowed = shutil.copytree(folder, tmp_path / "windowed")
    edit_config(windowed, sliding_window=4, is_causal=True, layer_types=["sliding_attention"] * 2)
    assert cosines(engine_vectors(windowed, TEXTS), st_reference(folder, TEXTS)).min() >= 0.9999


def test_check_names_the_family(folder):
    report = check_folder(str(folder))
    assert report.ok, report.error
    assert report.facts["family"].startswith("EuroBERT")
    assert report.facts["output"].startswith("pooling mean")
    assert report.facts["attention"] == "bidirectional"
    assert "query='query: '" in report.facts["prompts"]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"architectures": ["EuroBertForSequenceClassification"]}, "EuroBERT sequence classifiers"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 250000.0}}, "rope type 'yarn'"),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 250000.0}}, "rope type 'dynamic'"),
        ({"hidden_act": "gelu_fast"}, "activation 'gelu_fast' is not supported"),
    ],
)
def test_eurobert_refuses_what_it_does_not_implement(folder, tmp_path, changes, message):
    refused = shutil.copytree(folder, tmp_path / "refused")
    edit_config(refused, **changes)
    with pytest.raises(ConfigError, match=message):
        spec_from_folder(load_model_info(str(refused)))
    assert json.loads((folder / "config.json").read_text())["model_type"] == "eurobert"
