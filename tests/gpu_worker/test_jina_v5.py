"""jina-embeddings-v5-text-nano folders as published (a tiny random EuroBERT under model_type
jina_embeddings_v5, is_decoder false, task_names; PEFT LoRA adapters in adapters/<task>/; last-token
pooling; Query: / Document: prompts) through the tokenizer and one packed engine batch whose rows run
different tasks: each row equals sentence-transformers on a EuroBERT folder with that row's adapter merged
into the weights (W + scale * B @ A), as vLLM serves one task (cosine >= 0.9999 in fp32); the base model
for rows with no task; refusals of what the engine does not implement."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.engine.loader import load_weights, read_safetensors
from embedfleet.services.gpu_worker.engine.models.registry import build as build_model
from embedfleet.services.gpu_worker.engine.models.registry import spec_from_folder
from embedfleet.services.gpu_worker.engine.pooling import postprocess
from embedfleet.services.tokenizer.encoder import TextEncoder, pack_chunks
from embedfleet.shared.config import ConfigError
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.protocol import EmbedOptions
from tests.conftest import cosines
from tests.corpus import mixed_texts
from tests.engine_folders import edit_config
from tests.tiny_models import build, st_reference

TASKS = ("retrieval", "text-matching", "clustering", "classification")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
# per task: rank, alpha, rsLoRA, the projections it adapts (ranks differ; some leave projections alone)
ADAPTERS = {
    "retrieval": (4, 8.0, False, ATTENTION + MLP),
    "text-matching": (2, 4.0, True, ATTENTION + MLP),
    "clustering": (4, 4.0, False, ATTENTION),
    "classification": (4, 16.0, False, ("q_proj", *MLP)),
}
PROMPTS = {"query": "Query: ", "document": "Document: "}
TEXTS = mixed_texts(16)  # queries to whole documents, some cut at the model's 256 tokens


def _lasttoken_prompts(folder: Path) -> None:
    """v5's sentence-transformers files: last-token pooling, its two prompts, the document one by default."""
    pooling_path = folder / "1_Pooling" / "config.json"
    pooling = json.loads(pooling_path.read_text())
    modes = {key: key == "pooling_mode_lasttoken" for key in pooling if key.startswith("pooling_mode_")}
    pooling_path.write_text(json.dumps({**pooling, **modes}))
    st_path = folder / "config_sentence_transformers.json"
    st_config = json.loads(st_path.read_text())
    st_path.write_text(json.dumps({**st_config, "prompts": PROMPTS, "default_prompt_name": "document"}))


def _write_adapters(folder: Path, base: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """adapters/<task>/ in PEFT's layout; returns each task's merged weights (W + scale * B @ A)."""
    gen = torch.Generator().manual_seed(5)
    layers = sorted({int(name.split(".")[1]) for name in base if name.startswith("layers.")})
    merged = {}
    for task, (r, alpha, rslora, targets) in ADAPTERS.items():
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


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str | None, Path]:
    """The v5-nano folder (key "v5"), and the reference EuroBERT folders: None the base, each task merged."""
    root = tmp_path_factory.mktemp("jina_v5")
    base = build("eurobert", root)
    _lasttoken_prompts(base)
    v5 = shutil.copytree(base, root / "v5")
    edit_config(
        v5, model_type="jina_embeddings_v5", architectures=["JinaEmbeddingsV5Model"], is_decoder=False, task_names=TASKS
    )
    out: dict[str | None, Path] = {"v5": v5, None: base}
    for task, weights in _write_adapters(v5, load_file(base / "model.safetensors")).items():
        out[task] = shutil.copytree(base, root / f"merged-{task}")
        save_file({k: v.contiguous() for k, v in weights.items()}, out[task] / "model.safetensors")
    return out


def _engine(folder: Path) -> Engine:
    """The engine as the worker builds it: the base checkpoint loaded, then the folder's adapters."""
    info = load_model_info(str(folder))
    assert info.adapters == TASKS  # what the tokenizer lets a request choose
    return Engine(info, "cpu")


def _vectors(engine: Engine, rows: list[tuple[str, str, int]], dimensions: int | None = None) -> np.ndarray:
    """(text, prompt name, adapter) rows in one packed batch -> normalised vectors."""
    encoder = TextEncoder(engine.info)
    prompted = [encoder.with_prompt([text], EmbedOptions(prompt_name=prompt))[0] for text, prompt, _ in rows]
    (chunk,) = pack_chunks(encoder.encode(prompted), 1 << 20, 1024)
    adapters = np.array([adapter for _, _, adapter in rows], dtype=np.int64)
    made = engine.step(chunk.input_ids, chunk.cu_seqlens, adapters=adapters).result()
    assert isinstance(made, np.ndarray)
    return postprocess(made, True, dimensions, np.float32)


def test_rows_of_every_task_in_one_batch_equal_their_merged_adapter(folders):
    engine = _engine(folders["v5"])
    assert engine.adapter_names == TASKS
    # row i: task i % 5 (0: none, the base model), the query prompt on odd rows
    rows = [(text, "query" if i % 2 else "document", i % 5) for i, text in enumerate(TEXTS)]
    got = _vectors(engine, rows)
    want = np.empty_like(got)
    for task in (None, *TASKS):
        for prompt in PROMPTS:
            chosen = [
                i for i, (_, p, a) in enumerate(rows) if p == prompt and a == (TASKS.index(task) + 1 if task else 0)
            ]
            if chosen:
                want[chosen] = st_reference(folders[task], [TEXTS[i] for i in chosen], prompt)
    assert cosines(got, want).min() >= 0.9999
    # the adapters matter: the same rows on the base model are other vectors
    base = _vectors(engine, [(text, prompt, 0) for text, prompt, _ in rows])
    assert cosines(got[[i for i in range(16) if i % 5]], base[[i for i in range(16) if i % 5]]).max() < 0.999


def test_matryoshka_dimensions_with_an_adapter(folders):
    engine = _engine(folders["v5"])
    got = _vectors(engine, [(text, "query", 1) for text in TEXTS], dimensions=32)
    full = st_reference(folders["retrieval"], TEXTS, "query")[:, :32]
    assert got.shape == (16, 32)
    assert cosines(got, full / np.linalg.norm(full, axis=1, keepdims=True)).min() >= 0.9999


def test_spec_says_the_family(folders):
    spec = spec_from_folder(load_model_info(str(folders["v5"])))
    assert spec.family == "JinaV5" and not spec.causal


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"is_decoder": None}, r"v5-text-small, Qwen3"),
        ({"is_decoder": True}, r"v5-text-small, Qwen3"),
        ({"task_names": None}, "task_names must list"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 250000.0}}, "rope type 'yarn'"),
    ],
)
def test_config_refusals(folders, tmp_path, changes, message):
    refused = shutil.copytree(folders["v5"], tmp_path / "refused")
    edit_config(refused, **changes)
    with pytest.raises(ConfigError, match=message):
        spec_from_folder(load_model_info(str(refused)))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"use_dora": True}, "use_dora is not supported"),
        ({"target_modules": ["q_proj", "embed_tokens"]}, r"target_modules \['embed_tokens'\] are not supported"),
        ({"bias": "lora_only"}, "bias 'lora_only' is not supported"),
        ({"peft_type": "IA3"}, "peft_type 'IA3' is not supported"),
        ({"target_modules": "all-linear", "use_dora": True}, "use_dora is not supported"),
        ({"target_modules": ".*proj"}, r"target_modules \['\.\*proj'\] are not supported"),
    ],
)
def test_adapter_refusals(folders, tmp_path, changes, message):
    refused = shutil.copytree(folders["v5"], tmp_path / "refused")
    path = refused / "adapters" / "clustering" / "adapter_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))
    model = build_model(spec_from_folder(load_model_info(str(refused))))
    with pytest.raises(ConfigError, match=message):
        model.load_adapters(refused)


def test_adapter_tensors_of_other_layers_are_refused(folders, tmp_path):
    refused = shutil.copytree(folders["v5"], tmp_path / "refused")
    path = refused / "adapters" / "retrieval" / "adapter_model.safetensors"
    tensors = load_file(path)
    tensors["base_model.model.layers.7.mlp.up_proj.lora_A.weight"] = torch.zeros(4, 64)  # the model has 2 layers
    save_file(tensors, path)
    model = build_model(spec_from_folder(load_model_info(str(refused))))
    with pytest.raises(ConfigError, match=r"layers\.7\.mlp\.up_proj\.lora_A\.weight' is no LoRA pair"):
        model.load_adapters(refused)


def test_a_missing_task_adapter_is_named(folders, tmp_path):
    refused = shutil.copytree(folders["v5"], tmp_path / "refused")
    shutil.rmtree(refused / "adapters" / "classification")
    model = build_model(spec_from_folder(load_model_info(str(refused))))
    with pytest.raises(ConfigError, match=r"adapters/classification lacks adapter_config\.json"):
        model.load_adapters(refused)


def test_without_its_adapters_the_model_does_not_run(folders):
    """Rows asking for a task must never get the base model's vectors silently."""
    info = load_model_info(str(folders["v5"]))
    model = build_model(spec_from_folder(info))
    load_weights(model, read_safetensors(folders["v5"]))
    with pytest.raises(ConfigError, match="task adapters are not loaded"):
        Engine(info, "cpu", model=model.eval().requires_grad_(False)).embed(np.array([101, 7, 102]), np.array([0, 3]))
