"""Task adapters (LoRA) for the tests of a tiny jina-embeddings-v3 folder: random pairs for the five
tasks written into a copy of the folder in the published layout, and the reference of each task, the
model with that task's adapter merged into its weights (W + scale * B @ A), written here."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.engine_folders import edit_config
from tests.tiny_models import JINA_V3_PROMPTS

TASKS = list(JINA_V3_PROMPTS)  # retrieval.query, retrieval.passage, separation, classification, text-matching
RANK, ALPHA = 4, 2  # scale alpha / rank = 0.5: neither alpha, nor 1 / rank
SCALE = ALPHA / RANK
LINEARS = ("mixer.Wqkv", "mixer.out_proj", "mlp.fc1", "mlp.fc2")
EMBEDDINGS = ("embeddings.word_embeddings", "embeddings.token_type_embeddings")

Pairs = dict[str, tuple[torch.Tensor, torch.Tensor]]


def adapted_layers(tensors: dict[str, torch.Tensor]) -> list[str]:
    """The layers (checkpoint names without ``.weight``) the published checkpoint gives adapters."""
    layers = sorted({".".join(n.split(".")[:3]) for n in tensors if n.startswith("encoder.layers.")})
    return [*EMBEDDINGS, *(f"{layer}.{linear}" for layer in layers for linear in LINEARS)]


def random_pairs(tensors: dict[str, torch.Tensor], seed: int = 7) -> Pairs:
    """Random adapters for the five tasks, stacked as published: linear A [n, r, in], B [n, out, r];
    embedding A [n, vocab, r], B [n, r, dim]; B non-zero so every adapter changes the vectors."""
    gen = torch.Generator().manual_seed(seed)
    n, pairs = len(TASKS), {}
    for layer in adapted_layers(tensors):
        rows, cols = tensors[f"{layer}.weight"].shape
        embedding = layer in EMBEDDINGS  # weight [vocab, dim]; a linear's [out, in]
        shapes = ((n, rows, RANK), (n, RANK, cols)) if embedding else ((n, RANK, cols), (n, rows, RANK))
        a, b = (torch.randn(*shape, generator=gen) * 0.2 for shape in shapes)
        pairs[layer] = (a, b)
    return pairs


def with_adapters(folder: Path, out: Path, pairs: Pairs) -> Path:
    """A copy of ``folder`` at ``out`` with the adapters in the published layout: each adapted layer's
    weight at ``X.parametrizations.weight.original``, its pairs at ``X.parametrizations.weight.0.lora_A``
    / ``lora_B``, and config.json's lora_* keys."""
    out = Path(shutil.copytree(folder, out))
    tensors = load_file(out / "model.safetensors")
    for layer, (a, b) in pairs.items():
        tensors[f"{layer}.parametrizations.weight.original"] = tensors.pop(f"{layer}.weight")
        tensors[f"{layer}.parametrizations.weight.0.lora_A"] = a.contiguous()
        tensors[f"{layer}.parametrizations.weight.0.lora_B"] = b.contiguous()
    save_file(tensors, out / "model.safetensors")
    edit_config(out, lora_adaptations=TASKS, lora_rank=RANK, lora_alpha=ALPHA, lora_dropout_p=0.0)
    return out


def merged(folder: Path, out: Path, pairs: Pairs, task: int) -> Path:
    """A copy of ``folder`` (without adapters) at ``out`` with task ``task``'s adapter (index into TASKS)
    merged into its weights: linear W + scale * B @ A, embedding E + scale * A @ B."""
    out = Path(shutil.copytree(folder, out))
    tensors = load_file(out / "model.safetensors")
    for layer, (a, b) in pairs.items():
        delta = a[task] @ b[task] if layer in EMBEDDINGS else b[task] @ a[task]
        tensors[f"{layer}.weight"] = tensors[f"{layer}.weight"] + SCALE * delta
    save_file(tensors, out / "model.safetensors")
    return out
