"""Load safetensors weights from a Hugging Face folder into a family's model."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from embedfleet.services.gpu_worker.engine.models.base import EncoderModel
from embedfleet.shared.config.option import ConfigError

# old checkpoints name LayerNorm parameters gamma/beta
_LEGACY = {".LayerNorm.weight": ".LayerNorm.gamma", ".LayerNorm.bias": ".LayerNorm.beta"}


def safetensors_files(path: Path) -> list[Path]:
    """The checkpoint's safetensors files. None is refused, with the command that converts a lone torch pickle
    (pytorch_model.bin: some published folders still hold their weights so) once."""
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p.name for p in path.glob("*.bin"))
    how = ""
    if len(pickles) == 1:
        source, target = path / pickles[0], path / "model.safetensors"
        how = (
            f"; convert its {pickles[0]} once with python -c "
            '"import torch; from safetensors.torch import save_file; '
            f"save_file(torch.load('{source}'), '{target}')\""
        )
    raise ConfigError(f"{path} has no *.safetensors weights (only safetensors are loaded, never pickles){how}")


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    files = safetensors_files(path)
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safetensors' safe_open is no mapping: keys() is its list)
                tensors[name] = f.get_tensor(name)
    return tensors


def load_weights(model: EncoderModel, tensors: dict[str, torch.Tensor]) -> None:
    """Copy checkpoint tensors into ``model`` (any float dtype; cast to the model's)."""
    prefix = next((p for p in model.PREFIXES if f"{p}{model.PROBE}" in tensors), None)
    if prefix is None:
        raise ConfigError(
            f"checkpoint has no {model.PROBE!r} (under any of the prefixes {list(model.PREFIXES)}): "
            f"not a {model.spec.family} model"
        )

    def fetch(name: str) -> torch.Tensor:
        full = prefix + name
        if full in tensors:
            return tensors[full]
        for new, old in _LEGACY.items():
            if full.endswith(new) and (legacy := full[: -len(new)] + old) in tensors:
                return tensors[legacy]
        raise ConfigError(f"checkpoint is missing tensor {full!r}")

    params = dict(model.named_parameters())
    pairs = [
        (
            ours,
            model.weight_tensor(ours, torch.cat([fetch(n) for n in theirs]) if len(theirs) > 1 else fetch(theirs[0])),
        )
        for ours, theirs in model.weight_names().items()
    ]
    for ours, candidates in model.head_names().items():
        name = next((n for n in candidates if n in tensors), None)
        if name is None:
            raise ConfigError(f"classifier checkpoint has none of {candidates}")
        pairs.append((ours, model.head_tensor(ours, tensors[name])))
    loaded = {ours for ours, _ in pairs}
    if missing := sorted(set(params) - loaded):
        raise ConfigError(f"no checkpoint tensor maps to {missing[:5]} ({len(missing)} parameters)")  # a family bug
    for ours, value in pairs:
        target = params[ours]
        if value.shape != target.shape:
            raise ConfigError(f"tensor for {ours} has shape {tuple(value.shape)}, expected {tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(value.to(target.dtype))
