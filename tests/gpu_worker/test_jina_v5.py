"""jina-embeddings-v5-text-nano folders as published (a tiny random EuroBERT under model_type
jina_embeddings_v5, is_decoder false, task_names; PEFT LoRA adapters in adapters/<task>/; last-token
pooling; Query: / Document: prompts) through the tokenizer and one packed engine batch whose rows run
different tasks: each row equals sentence-transformers on a EuroBERT folder with that row's adapter merged
into the weights (W + scale * B @ A), as vLLM serves one task (cosine >= 0.9999 in fp32); the base model
for rows with no task; refusals of what the engine does not implement."""

from __future__ import annotations

import json
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
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.protocol import EmbedOptions
from tests.conftest import cosines
from tests.support.corpus import mixed_texts
from tests.support.engine_folders import edit_config
from tests.support.task_adapters import V5_PROMPTS as PROMPTS
from tests.support.task_adapters import V5_TASKS as TASKS
from tests.support.task_adapters import v5_folders
from tests.support.tiny_models import st_reference

TEXTS = mixed_texts(16)  # queries to whole documents, some cut at the model's 256 tokens


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str | None, Path]:
    return v5_folders(tmp_path_factory.mktemp("jina_v5"))


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
