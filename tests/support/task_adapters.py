"""Task adapters (LoRA) for the tests of a tiny jina-embeddings-v3 folder: random pairs for the five
tasks written into a copy of the folder in the published layout, and the reference of each task, the
model with that task's adapter merged into its weights (W + scale * B @ A), written here."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from bench import families
from tests.support.engine_folders import edit_config
from tests.support.tiny_models import JINA_V3_PROMPTS, build

TASKS = list(JINA_V3_PROMPTS)  # retrieval.query, retrieval.passage, separation, classification, text-matching
RANK, ALPHA = 4, 2  # scale alpha / rank = 0.5: neither alpha, nor 1 / rank
SCALE = ALPHA / RANK
EMBEDDINGS = ("embeddings.word_embeddings", "embeddings.token_type_embeddings")

Pairs = dict[str, tuple[torch.Tensor, torch.Tensor]]


def random_pairs(tensors: dict[str, torch.Tensor], seed: int = 7) -> Pairs:
    """Random adapters for the five tasks on every layer the published checkpoint adapts, stacked as
    published (bench/families.py): B non-zero so every adapter changes the vectors."""
    return families.jina_v3_pairs(tensors, len(TASKS), RANK, seed)


def with_adapters(folder: Path, out: Path, pairs: Pairs) -> Path:
    """A copy of ``folder`` at ``out`` with the adapters in the published layout (bench/families.py)."""
    out = Path(shutil.copytree(folder, out))
    families.add_jina_v3_adapters(out, tuple(TASKS), RANK, ALPHA, pairs)
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


# -- jina-embeddings-v5-text-nano: EuroBERT with PEFT adapters in adapters/<task>/ --------------------------

V5_TASKS = ("retrieval", "text-matching", "clustering", "classification")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
# per task: rank, alpha, rsLoRA, the projections it adapts (ranks differ; some leave projections alone)
V5_ADAPTERS = {
    "retrieval": (4, 8.0, False, ATTENTION + MLP),
    "text-matching": (2, 4.0, True, ATTENTION + MLP),
    "clustering": (4, 4.0, False, ATTENTION),
    "classification": (4, 16.0, False, ("q_proj", *MLP)),
}
V5_PROMPTS = {"query": "Query: ", "document": "Document: "}


def _lasttoken_prompts(folder: Path) -> None:
    """v5's sentence-transformers files: last-token pooling, its two prompts, the document one by default."""
    pooling_path = folder / "1_Pooling" / "config.json"
    pooling = json.loads(pooling_path.read_text())
    modes = {key: key == "pooling_mode_lasttoken" for key in pooling if key.startswith("pooling_mode_")}
    pooling_path.write_text(json.dumps({**pooling, **modes}))
    st_path = folder / "config_sentence_transformers.json"
    st_config = json.loads(st_path.read_text())
    st_path.write_text(json.dumps({**st_config, "prompts": V5_PROMPTS, "default_prompt_name": "document"}))


def _write_adapters(folder: Path, base: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """adapters/<task>/ in PEFT's layout; returns each task's merged weights (W + scale * B @ A)."""
    gen = torch.Generator().manual_seed(5)
    layers = sorted({int(name.split(".")[1]) for name in base if name.startswith("layers.")})
    merged = {}
    for task, (r, alpha, rslora, targets) in V5_ADAPTERS.items():
        scale = alpha / math.sqrt(r) if rslora else alpha / r
        tensors, weights = {}, dict(base)
        for i in layers:
            for p in targets:
                name = f"layers.{i}.{'self_attn' if p in ATTENTION else 'mlp'}.{p}"
                out, inp = base[f"{name}.weight"].shape
                a, b = torch.randn(r, inp, generator=gen) * 0.2, torch.randn(out, r, generator=gen) * 0.2
                tensors[f"base_model.model.{name}.lora_A.weight"] = a
                tensors[f"base_model.model.{name}.lora_B.weight"] = b
                weights[f"{name}.weight"] = base[f"{name}.weight"] + scale * b @ a
        path = folder / "adapters" / task
        path.mkdir(parents=True)
        save_file(tensors, path / "adapter_model.safetensors")
        config = dict(peft_type="LORA", r=r, lora_alpha=alpha, use_rslora=rslora, target_modules=list(targets))
        (path / "adapter_config.json").write_text(json.dumps(config | dict(bias="none", lora_dropout=0.0)))
        merged[task] = weights
    return merged


def v5_folders(root: Path) -> dict[str | None, Path]:
    """A tiny jina-embeddings-v5-text-nano folder as published (key "v5"), and its reference EuroBERT
    folders: None the base, each task its adapter merged into the weights (W + scale * B @ A)."""
    base = build("eurobert", root)
    _lasttoken_prompts(base)
    v5 = shutil.copytree(base, root / "v5")
    edit_config(
        v5,
        model_type="jina_embeddings_v5",
        architectures=["JinaEmbeddingsV5Model"],
        is_decoder=False,
        task_names=V5_TASKS,
    )
    out: dict[str | None, Path] = {"v5": v5, None: base}
    for task, weights in _write_adapters(v5, load_file(base / "model.safetensors")).items():
        out[task] = shutil.copytree(base, root / f"merged-{task}")
        save_file({k: v.contiguous() for k, v in weights.items()}, out[task] / "model.safetensors")
    return out
