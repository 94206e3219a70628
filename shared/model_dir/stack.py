"""An embedder's module stack, as sentence-transformers 5/6 runs it: Transformer -> Pooling -> any
number of Dense -> Normalize. The Pooling module's mode and each Dense module's layer are read here;
any other module, or these in another order, is refused."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.families import family_types
from embedfleet.shared.model_dir.folder import ModelFolder, read_json

POOLING_MODES = ("mean", "cls", "lasttoken", "max", "weightedmean", "mean_sqrt_len")
SUPPORTED_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")  # in the order they must run
JINA_TRANSFORMER = "custom_st.Transformer"  # a model with task adapters: its Transformer taking a task

# sentence-transformers' pooling mode names (underscores dropped, as older configs vary) -> ours
_ST_POOLING = {
    "cls": "cls",
    "max": "max",
    "mean": "mean",
    "meansqrtlentokens": "mean_sqrt_len",
    "weightedmean": "weightedmean",
    "lasttoken": "lasttoken",
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
    "Identity": "identity",
    "Tanh": "tanh",
    "ReLU": "relu",
    "GELU": "gelu",
    "Sigmoid": "sigmoid",
    "SiLU": "silu",
}


@dataclass(frozen=True, slots=True)
class DenseSpec:
    """One sentence-transformers Dense module: y = activation(x @ W.T + b), on the pooled vector."""

    path: Path  # the module's model.safetensors ("linear.weight" [out, in], "linear.bias" [out])
    in_features: int
    out_features: int
    bias: bool
    activation: str  # one of _ACTIVATIONS' values


@dataclass(frozen=True, slots=True)
class Stack:
    pooling: Path | None  # the Pooling module's folder
    dense: tuple[Path, ...]  # each Dense module's folder, in order
    normalize: bool


def read_stack(folder: ModelFolder) -> Stack:
    """modules.json -> its modules' folders; anything but Transformer -> Pooling -> Dense* -> Normalize is refused."""
    kinds: list[str] = []
    pooling: Path | None = None
    dense: list[Path] = []
    for module in folder.modules:
        kind = module.kind
        # jina-embeddings-v3's own Transformer module (custom_st.py) only passes a task on to its adapters
        custom = module.type == JINA_TRANSFORMER and bool(folder.config.get("lora_adaptations"))
        if not (module.type.startswith("sentence_transformers.") or custom) or kind not in SUPPORTED_MODULES:
            raise ConfigError(
                f"modules.json module {module.type!r} ({module.path}) is not supported; supported: "
                f"{', '.join(SUPPORTED_MODULES)}"
            )
        kinds.append(kind)
        if kind == "Pooling":
            pooling = folder.module_dir(module, "1_Pooling")
        elif kind == "Dense":
            dense.append(folder.module_dir(module))
        elif kind == "Normalize":
            check_module_io(folder.module_dir(module), "Normalize")
    order = [SUPPORTED_MODULES.index(k) for k in kinds]
    repeated = [k for k in ("Transformer", "Pooling", "Normalize") if kinds.count(k) > 1]
    if order != sorted(order) or repeated or (kinds and kinds[0] != "Transformer") or (dense and pooling is None):
        raise ConfigError(
            f"modules.json runs {' -> '.join(kinds)}: only Transformer -> Pooling -> Dense (any number) -> Normalize "
            "is supported, each of Transformer, Pooling, Normalize at most once"
        )
    if pooling is None and (folder.path / "1_Pooling").is_dir():
        pooling = folder.path / "1_Pooling"
    return Stack(pooling=pooling, dense=tuple(dense), normalize="Normalize" in kinds)


def check_module_io(folder: Path, kind: str, on: str = "sentence_embedding") -> dict[str, Any]:
    """A Dense or Normalize module must read and write ``on``: the pooled vector (or, in a multi-vector
    encoder, the token states)."""
    config = read_json(folder / "config.json")
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, on) != on:
            raise ConfigError(
                f"{folder / 'config.json'}: {kind} with {key}={config[key]!r} is not supported here (only modules on {on!r})"
            )
    return config


def read_dense(folder: Path, on: str = "sentence_embedding") -> DenseSpec:
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{folder / 'config.json'} is missing (a Dense module in modules.json)")
    config = check_module_io(folder, "Dense", on)
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


def check_dense_chain(dense: tuple[DenseSpec, ...], pooled_dim: int) -> None:
    """Each Dense layer reads what the one before it writes (the first, the pooled vector)."""
    width = pooled_dim
    for spec in dense:
        if spec.in_features != width:
            raise ConfigError(
                f"{spec.path.parent}: Dense in_features {spec.in_features} != its input's dimension {width}"
            )
        width = spec.out_features


def pooling_mode(pooling_config: dict[str, Any], config: dict[str, Any], folder: Path | None) -> str:
    """The Pooling module's one mode (a POOLING_MODES name), from either config format sentence-transformers
    writes; with no Pooling config, the family's default."""
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
    """No sentence-transformers config: the family's pooling where it has one, else decoders pool the
    last token and encoders the mean."""
    family = family_types(config.get("model_type"))
    if family is not None and family.pooling is not None:
        return family.pooling
    causal = any(str(a).endswith("ForCausalLM") for a in config.get("architectures") or [])
    return "lasttoken" if config.get("is_decoder") or causal else "mean"
