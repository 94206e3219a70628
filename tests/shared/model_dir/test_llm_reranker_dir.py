"""An LLM reranker's folder (CrossEncoder: a causal LM, then LogitScore) read as sentence-transformers
reads it: a one-logit scorer, its answer tokens, chat template, message format, prompt and activation;
folders sentence-transformers could not run are refused with the reason."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.load import load_model_info
from tests.support.tiny_llm_rerankers import build_llm_reranker, reference


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return build_llm_reranker(tmp_path_factory.mktemp("llm-dir"), "qwen3", prompt="Find the passage")


def _edit(src: Path, dst: Path, name: str, change) -> Path:
    shutil.copytree(src, dst)
    path = dst / name
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return dst


def test_folder_reads_as_the_cross_encoder(folder):
    model = reference(folder)
    info = load_model_info(str(folder))
    assert (info.task, info.scores, info.dim, info.normalize) == ("score", True, 1, False)
    assert info.score_tokens == (model[1].true_token_id, model[1].false_token_id)
    assert info.pair_template == model.tokenizer.chat_template
    assert info.message_format == model[0].input_formatter.message_format == "flat"
    assert info.prompts[info.default_prompt] == model.prompts[model.default_prompt_name] == "Find the passage"
    assert info.max_seq_length == model.max_seq_length
    assert isinstance(model.activation_fn, torch.nn.Sigmoid) and info.score_activation == "sigmoid"


def test_a_saved_identity_activation_is_read(folder, tmp_path):
    identity = _edit(
        folder,
        tmp_path / "identity",
        "config_sentence_transformers.json",
        lambda c: {**c, "activation_fn": "torch.nn.modules.linear.Identity"},
    )
    assert isinstance(reference(identity).activation_fn, torch.nn.Identity)
    assert load_model_info(str(identity)).score_activation == "identity"


@pytest.mark.parametrize(
    "name, change, message",
    [
        ("modules.json", lambda m: m[::-1], "runs LogitScore -> Transformer"),
        ("config.json", lambda c: {**c, "architectures": ["Qwen3Model"]}, "a …ForCausalLM is needed"),
        ("1_LogitScore/config.json", lambda c: {**c, "true_token_id": 10**6}, "below the vocabulary size"),
        ("1_LogitScore/config.json", lambda c: {**c, "module_input_name": "token_embeddings"}, "only 'causal_logits'"),
        (
            "sentence_bert_config.json",
            lambda c: {**c, "transformer_task": "feature-extraction"},
            "cannot feed LogitScore",
        ),
    ],
)
def test_folders_that_cannot_score_are_refused(folder, tmp_path, name, change, message):
    with pytest.raises(ConfigError, match=message):
        load_model_info(str(_edit(folder, tmp_path / "bad", name, change)))


def test_message_pairs_without_a_chat_template_are_refused(folder, tmp_path):
    bad = shutil.copytree(folder, tmp_path / "no-template")
    (bad / "chat_template.jinja").unlink()
    config = json.loads((bad / "tokenizer_config.json").read_text())
    (bad / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "chat_template"}))
    with pytest.raises(ConfigError, match="renders pairs as chat messages, but the folder has no chat template"):
        load_model_info(str(bad))
