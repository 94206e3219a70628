import json
import shutil
from pathlib import Path

import pytest

from shared.config import ConfigError
from shared.model_dir import load_model_info, same_model


def test_default_model_reads_sentence_transformers_configs(model_info):
    assert model_info.id == "all-MiniLM-L6-v2"
    # tokenizer.json says 128; the real limit is sentence_bert_config.json's max_seq_length
    assert model_info.max_seq_length == 256
    assert model_info.pooling == "mean"
    assert model_info.normalize is True
    assert model_info.dim == 384
    assert model_info.vocab_size == 30522


def _copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    return dst


def test_cls_pooling_without_normalize(model_info, tmp_path):
    folder = _copy_model(model_info.path, tmp_path / "my-model")
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 384, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    modules = [m for m in json.loads((folder / "modules.json").read_text()) if not m["type"].endswith("Normalize")]
    (folder / "modules.json").write_text(json.dumps(modules))
    info = load_model_info(str(folder))
    assert (info.id, info.pooling, info.normalize) == ("my-model", "cls", False)
    assert load_model_info(str(folder), "custom-name").id == "custom-name"


def test_xlm_roberta_limit_accounts_for_position_offset(model_info, tmp_path):
    folder = _copy_model(model_info.path, tmp_path / "xlmr")
    config = json.loads((folder / "config.json").read_text())
    config |= {"model_type": "xlm-roberta", "pad_token_id": 1, "max_position_embeddings": 514}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 1024}))
    assert load_model_info(str(folder)).max_seq_length == 512


def test_missing_folder_and_files_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="is not a folder"):
        load_model_info(str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="config.json is missing"):
        load_model_info(str(tmp_path))


def test_unsupported_pooling_is_refused(model_info, tmp_path):
    folder = _copy_model(model_info.path, tmp_path / "m")
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "weightedmean"}))
    with pytest.raises(ConfigError, match="not supported"):
        load_model_info(str(folder))


def test_model_aliases():
    assert same_model("sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2")
    assert same_model("all-MiniLM-L6-v2", "all-MiniLM-L6-v2")
    assert not same_model("all-MiniLM-L12-v2", "all-MiniLM-L6-v2")
