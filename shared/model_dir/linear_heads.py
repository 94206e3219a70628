"""Small linear heads stored beside a model's weights (BGE-M3's sparse_linear and colbert_linear).

A head file holds ``weight`` [out, in] and optionally ``bias`` [out], as safetensors. FlagEmbedding
saves them as torch pickles (``*.pt``), which are never loaded here (unpickling runs code the file
chooses): a folder that has only those is refused with the command that converts them once.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embedfleet.shared.config.option import ConfigError


def read_linear(path: Path) -> dict[str, np.ndarray]:
    """``{"weight": [out, in], "bias": [out]?}`` as float32 arrays."""
    if path.suffix != ".safetensors":
        raise ConfigError(pickled_head(path))
    try:
        from safetensors.numpy import load_file

        tensors = load_file(str(path))
    except Exception as exc:  # corrupt files raise assorted errors
        raise ConfigError(f"cannot read {path}: {str(exc)[:300]}") from None
    weight = tensors.get("weight")
    if weight is None or weight.ndim != 2:
        raise ConfigError(f"{path} needs a 2-d 'weight' (has {', '.join(sorted(tensors)) or 'nothing'})")
    bias = tensors.get("bias")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ConfigError(f"{path}: 'bias' has shape {list(bias.shape)}, 'weight' {list(weight.shape)}")
    out = {"weight": np.asarray(weight, dtype=np.float32)}
    if bias is not None:
        out["bias"] = np.asarray(bias, dtype=np.float32)
    return out


def pickled_head(path: Path) -> str:
    target = path.with_suffix(".safetensors")
    return (
        f"{path} is a torch pickle, which is never loaded (only safetensors are): convert it once with "
        f'python -c "import torch; from safetensors.torch import save_file; '
        f"save_file(torch.load('{path}'), '{target}')\""
    )


def linear_shape(path: Path) -> tuple[int, int]:
    """(out, in) of a head file's weight."""
    if path.suffix == ".safetensors":
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="np") as f:
                if "weight" in f.keys():  # noqa: SIM118 (safe_open is no mapping)
                    shape = f.get_slice("weight").get_shape()
                    if len(shape) == 2:
                        return int(shape[0]), int(shape[1])
        except Exception as exc:
            raise ConfigError(f"cannot read {path}: {str(exc)[:300]}") from None
    weight = read_linear(path)["weight"]
    return int(weight.shape[0]), int(weight.shape[1])
