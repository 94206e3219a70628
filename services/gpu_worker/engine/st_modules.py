"""sentence-transformers modules that run after pooling: the Dense layers of a model folder.

Each Dense is ``activation(linear(x))`` on the pooled vector (ST's Dense module, use_residual off).
They run in float32 whatever the encoder's dtype: the pooled vector is float32, and these layers are
a few small GEMMs per batch, so half precision would save nothing worth the rounding.
"""

from __future__ import annotations

import torch
from safetensors import safe_open
from torch import nn

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.info import ModelInfo
from embedfleet.shared.model_dir.stack import DenseSpec

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "identity": nn.Identity,
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "gelu": nn.GELU,  # exact (erf) GELU: ST instantiates torch.nn.GELU() with no arguments
    "sigmoid": nn.Sigmoid,
    "silu": nn.SiLU,
}


class DenseStack(nn.Module):
    """The model folder's Dense layers in modules.json order: [R, in] -> [R, out], float32."""

    def __init__(self, specs: tuple[DenseSpec, ...]) -> None:
        super().__init__()
        if not specs:
            raise ValueError("DenseStack needs at least one Dense layer")
        self.linears = nn.ModuleList()
        self.activations = nn.ModuleList()
        for spec in specs:
            if spec.activation not in _ACTIVATIONS:
                raise ConfigError(f"{spec.path.parent}: Dense activation {spec.activation!r} is not supported")
            linear = nn.Linear(spec.in_features, spec.out_features, bias=spec.bias, dtype=torch.float32)
            _load_linear(linear, spec)
            self.linears.append(linear)
            self.activations.append(_ACTIVATIONS[spec.activation]())
        self.in_features = specs[0].in_features
        self.out_features = specs[-1].out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [R, in_features] float32 (pooled) -> [R, out_features]
        for linear, activation in zip(self.linears, self.activations):
            x = activation(linear(x))
        return x


def build_dense(info: ModelInfo, device: torch.device) -> DenseStack | None:
    """The folder's Dense layers on ``device`` (float32, eval, no grad), or None when it has none."""
    if not info.dense:
        return None
    return DenseStack(info.dense).to(device).eval().requires_grad_(False)


def _load_linear(linear: nn.Linear, spec: DenseSpec) -> None:
    """Copy "linear.weight" [out, in] (and "linear.bias" [out]) from the Dense's model.safetensors."""
    if not spec.path.is_file():
        raise ConfigError(f"{spec.path} is missing (the weights of a Dense module; only safetensors are loaded)")
    expected = {"linear.weight": linear.weight}
    if linear.bias is not None:
        expected["linear.bias"] = linear.bias
    try:
        with safe_open(str(spec.path), framework="pt") as f:
            names = set(f.keys())
            if missing := [name for name in expected if name not in names]:
                raise ConfigError(
                    f"{spec.path} lacks {', '.join(missing)} (has {', '.join(sorted(names)) or 'nothing'})"
                )
            tensors = {name: f.get_tensor(name) for name in expected}
    except ConfigError:
        raise
    except Exception as exc:  # safetensors raises its own error types for a corrupt header
        raise ConfigError(f"cannot read {spec.path}: {exc}") from None
    with torch.no_grad():
        for name, param in expected.items():
            tensor = tensors[name]
            if tuple(tensor.shape) != tuple(param.shape):
                raise ConfigError(
                    f"{spec.path}: {name} has shape {list(tensor.shape)}, the Dense config says {list(param.shape)}"
                )
            param.copy_(tensor.to(torch.float32))
