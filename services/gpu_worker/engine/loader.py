"""Load safetensors weights from a Hugging Face folder into a BertEncoder."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from shared.config import ConfigError
from services.gpu_worker.engine.bert import BertEncoder, hf_head_names, hf_weight_names

_PREFIXES = ("", "bert.", "roberta.", "model.")
# old checkpoints name LayerNorm parameters gamma/beta
_LEGACY = {".LayerNorm.weight": ".LayerNorm.gamma", ".LayerNorm.bias": ".LayerNorm.beta"}


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{path} has no *.safetensors weights (only safetensors are loaded, never pickles)")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    return tensors


def load_weights(model: BertEncoder, tensors: dict[str, torch.Tensor]) -> None:
    """Copy checkpoint tensors into ``model`` (any float dtype; cast to the model's)."""
    prefix = next((p for p in _PREFIXES if f"{p}embeddings.word_embeddings.weight" in tensors), None)
    if prefix is None:
        raise ConfigError("checkpoint has no embeddings.word_embeddings.weight: not a BERT-family model")

    def fetch(name: str) -> torch.Tensor:
        full = prefix + name
        if full in tensors:
            return tensors[full]
        for new, old in _LEGACY.items():
            if full.endswith(new) and (legacy := full[: -len(new)] + old) in tensors:
                return tensors[legacy]
        raise ConfigError(f"checkpoint is missing tensor {full!r}")

    params = dict(model.named_parameters())
    pairs = [(ours, torch.cat([fetch(n) for n in theirs], dim=0) if len(theirs) > 1 else fetch(theirs[0]))
             for ours, theirs in hf_weight_names(model.spec).items()]
    for ours, candidates in hf_head_names(model.spec).items():
        name = next((n for n in candidates if n in tensors), None)
        if name is None:
            raise ConfigError(f"cross-encoder checkpoint has none of {candidates}")
        pairs.append((ours, tensors[name]))
    for ours, value in pairs:
        target = params[ours]
        if value.shape != target.shape:
            raise ConfigError(f"tensor for {ours} has shape {tuple(value.shape)}, expected {tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(value.to(target.dtype))
