"""Sanity checks of the tiny model builder (tests/support/tiny_models.py): each folder loads and runs in
sentence-transformers / transformers, and the tokenizer.json the engine reads gives their ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sentence_transformers import CrossEncoder, SentenceTransformer
from tokenizers import Tokenizer

from tests.support import tiny_models
from tests.support.tiny_models import CLASSIFIERS, DECODERS, FAMILIES, MAX_SEQ_LENGTH

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("hub_offline")]

TEXTS = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Stock markets fell sharply as investors worried about rising interest rates in 2024!",
    "what is a tokenizer?",
]
PAIRS = [("what is a fox", TEXTS[0]), ("stock markets", TEXTS[1]), ("x", "y z")]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="module")
def embedder(root: Path):
    """family -> (folder, SentenceTransformer), built on first use."""
    built: dict[str, tuple[Path, SentenceTransformer]] = {}

    def get(family: str) -> tuple[Path, SentenceTransformer]:
        if family not in built:
            folder = tiny_models.build(family, root)
            built[family] = folder, SentenceTransformer(str(folder), device="cpu")
        return built[family]

    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_embedder_folder(family: str, embedder) -> None:
    folder, _ = embedder(family)
    assert folder.name == family
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "modules.json",
        "sentence_bert_config.json",
        "1_Pooling/config.json",
        "config_sentence_transformers.json",
    ):
        assert (folder / name).is_file(), name
    tokenizer_json = json.loads((folder / "tokenizer.json").read_text())
    assert tokenizer_json["padding"] is None and tokenizer_json["truncation"] is None
    assert json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"] == MAX_SEQ_LENGTH
    assert json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"] == MAX_SEQ_LENGTH
    types = [m["type"].rsplit(".", 1)[-1] for m in json.loads((folder / "modules.json").read_text())]
    dense = ["Dense", "Dense"] if family == "gemma3" else []
    assert types == ["Transformer", "Pooling", *dense, "Normalize"]
    pooling = json.loads((folder / "1_Pooling/config.json").read_text())["pooling_mode"]
    assert pooling == ("lasttoken" if family in (*DECODERS, "gemma2") else "cls" if family == "gte" else "mean")


@pytest.mark.parametrize("family", FAMILIES)
def test_embedder_encodes_distinct_unit_vectors(family: str, embedder) -> None:
    _, model = embedder(family)
    vectors = model.encode(TEXTS, convert_to_numpy=True)
    assert vectors.shape == (len(TEXTS), 64) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cosines = vectors @ vectors.T
    assert cosines[np.triu_indices(len(TEXTS), 1)].max() < 0.99  # random weights, yet not degenerate
    for name, prompt in model.prompts.items():
        if prompt:
            prompted = model.encode(TEXTS, prompt_name=name, convert_to_numpy=True)
            assert np.abs(prompted - vectors).max() > 1e-3, name


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_json_ids_equal_sentence_transformers(family: str, embedder) -> None:
    folder, model = embedder(family)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for prompt in ["", *(p for p in model.prompts.values() if p)]:
        for text in TEXTS:
            ids = tokenizer.encode(prompt + text, add_special_tokens=True).ids
            assert ids == model.tokenizer(prompt + text)["input_ids"], (prompt, text)
            # what encode(prompt_name=...) feeds the model: the prompt prepended to the text
            assert ids == model.preprocess([text], prompt=prompt or None)["input_ids"][0].tolist(), (prompt, text)


@pytest.mark.parametrize(
    ("family", "kwargs"),
    [(f, {}) for f in CLASSIFIERS] + [("qwen3", {"num_labels": 3}), ("modernbert", {"cls_pooling": "mean"})],
)
def test_classifier_scores(family: str, kwargs: dict, tmp_path: Path) -> None:
    folder = tiny_models.build(family, tmp_path, classifier=True, **kwargs)
    assert folder.name == f"{family}-cls" and not (folder / "modules.json").exists()
    logits = tiny_models.hf_reference_logits(folder, PAIRS)
    assert logits.shape == (len(PAIRS), kwargs.get("num_labels", 1)) and logits.dtype == np.float32
    assert np.ptp(logits, axis=0).max() > 1e-3
    scores = CrossEncoder(str(folder), device="cpu").predict(PAIRS, activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(np.asarray(scores).reshape(logits.shape), logits, atol=1e-5)
    assert tiny_models.hf_reference_logits(folder, TEXTS).shape == (len(TEXTS), logits.shape[1])
    if family in DECODERS:
        # a padded batch scores as each pair alone: the classifier finds each row's last real token
        alone = np.concatenate([tiny_models.hf_reference_logits(folder, [pair]) for pair in PAIRS])
        np.testing.assert_allclose(alone, logits, atol=1e-5)


@pytest.mark.parametrize("family", DECODERS)
def test_bidirectional_variant(family: str, embedder, root: Path) -> None:
    folder = tiny_models.build(family, root, bidirectional=True)
    assert folder.name == f"{family}-bidir"
    config = json.loads((folder / "config.json").read_text())
    assert config["is_causal"] is False and config["use_bidirectional_attention"] is True
    # transformers 5 builds a bidirectional mask from is_causal=False: the vectors change
    causal = embedder(family)[1].encode(TEXTS, convert_to_numpy=True)
    assert np.abs(tiny_models.st_reference(folder, TEXTS) - causal).max() > 1e-3


def test_builds_are_deterministic(embedder, tmp_path: Path) -> None:
    first, _ = embedder("gemma3")
    again = tiny_models.build("gemma3", tmp_path)
    for name in ("model.safetensors", "2_Dense/model.safetensors", "3_Dense/model.safetensors", "tokenizer.json"):
        assert (first / name).read_bytes() == (again / name).read_bytes(), name


def test_st_reference_matches_the_loaded_model(embedder) -> None:
    folder, model = embedder("qwen3")
    expected = model.encode(TEXTS, prompt_name="query", convert_to_numpy=True)
    np.testing.assert_allclose(tiny_models.st_reference(folder, TEXTS, prompt_name="query"), expected, atol=1e-6)
