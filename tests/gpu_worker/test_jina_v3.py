"""jina-embeddings-v3 folders (a tiny random JinaEmbeddingsV3Model saved by transformers, in sentence-transformers
modules; task adapters added here in the published layout) through the tokenizer and one packed engine batch
of texts of many lengths: the base model equals sentence-transformers; each task's rows equal the model with
that task's adapter merged into its weights (W + scale * B @ A, written here), tasks mixed in one batch too;
the published config form (xlm-roberta with rotary positions, tensors under ``roberta.``) gives the same
vectors; what the engine does not implement, or a checkpoint that lacks what its config lists, is refused.
(cosine >= 0.9999 in fp32 throughout)"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.engine.models import bert, jina_v3
from embedfleet.services.gpu_worker.engine.models.registry import family_for, spec_from_folder
from embedfleet.services.tokenizer.encoder import TextEncoder, pack_chunks
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.load import load_model_info
from tests.conftest import cosines
from tests.support.corpus import mixed_texts
from tests.support.engine_folders import edit_config, engine_vectors
from tests.support.task_adapters import RANK, TASKS, Pairs, merged, random_pairs, with_adapters
from tests.support.tiny_models import JINA_V3_PROMPTS, build, st_reference

HEAD_DIM = 16  # the tiny model's 64 / 4


def _texts() -> list[str]:
    texts = mixed_texts(16)  # queries to whole documents: some cut at the model's 256 tokens
    assert len({len(t) for t in texts}) > 8
    return texts


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return build("jina_embeddings_v3", tmp_path_factory.mktemp("jina"))


@pytest.fixture(scope="module")
def pairs(folder) -> Pairs:
    return random_pairs(load_file(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def adapted(folder, pairs, tmp_path_factory) -> Path:
    """The folder with the five task adapters in the published layout (tests/support/task_adapters.py)."""
    return with_adapters(folder, tmp_path_factory.mktemp("adapted") / "jina", pairs)


@pytest.fixture(scope="module")
def references(folder, pairs, tmp_path_factory) -> list[np.ndarray]:
    """sentence-transformers' vectors of the texts: [0] the base model, [i] the model with task i's adapter
    merged into its weights (linear W + scale * B_i @ A_i, embedding E + scale * A_i @ B_i)."""
    texts = _texts()
    return [st_reference(folder, texts)] + [
        st_reference(merged(folder, tmp_path_factory.mktemp("merged") / "jina", pairs, i), texts)
        for i in range(len(TASKS))
    ]


def _chunk(folder: Path, texts: list[str]):
    """The folder's info, and its tokenized texts packed into one chunk."""
    info = load_model_info(str(folder))
    encoder = TextEncoder(info)
    (chunk,) = pack_chunks(encoder.encode(texts), 1 << 20, 1024)
    return info, chunk


def engine_rows(folder: Path, texts: list[str], adapters: list[int]) -> np.ndarray:
    """The engine's vectors [N, hidden] of the texts in one packed batch, row r through adapter adapters[r]."""
    info, chunk = _chunk(folder, texts)
    vectors = Engine(info, "cpu").step(chunk.input_ids, chunk.cu_seqlens, adapters=np.array(adapters)).result()
    assert isinstance(vectors, np.ndarray)
    return vectors


def test_base_model_equals_sentence_transformers(folder, references):
    texts = _texts()
    assert cosines(engine_vectors(folder, texts), references[0]).min() >= 0.9999
    got = engine_vectors(folder, texts, "retrieval.query")
    assert cosines(got, st_reference(folder, texts, "retrieval.query")).min() >= 0.9999
    assert Engine(load_model_info(str(folder)), "cpu").adapter_names == ()


def test_adapted_folder_without_a_task_is_the_base_model(adapted, references):
    texts = _texts()
    engine = Engine(load_model_info(str(adapted)), "cpu")
    assert engine.adapter_names == tuple(TASKS)
    assert cosines(engine_vectors(adapted, texts), references[0]).min() >= 0.9999
    assert cosines(engine_rows(adapted, texts, [0] * len(texts)), references[0]).min() >= 0.9999


@pytest.mark.parametrize("task", range(1, len(TASKS) + 1), ids=TASKS)
def test_each_task_equals_its_adapter_merged_into_the_weights(adapted, references, task):
    texts = _texts()
    got = engine_rows(adapted, texts, [task] * len(texts))
    assert cosines(got, references[task]).min() >= 0.9999
    assert cosines(references[task], references[0]).max() < 0.999  # the adapter changed every vector


def _mixed(n: int) -> list[int]:
    """Rows' adapters interleaved: every task and none, neighbours different."""
    return [(5 * r) % (len(TASKS) + 1) for r in range(n)]


def test_tasks_mixed_in_one_batch_each_equal_their_own_model(adapted, references):
    texts = _texts()
    adapters = _mixed(len(texts))
    assert set(adapters) == set(range(len(TASKS) + 1))
    got = engine_rows(adapted, texts, adapters)
    want = np.stack([references[a][r] for r, a in enumerate(adapters)])
    assert cosines(got, want).min() >= 0.9999
    # each row's own adapter, not its neighbour's: shifted by one row the tasks no longer match
    wrong = np.stack([references[adapters[(r + 1) % len(texts)]][r] for r in range(len(texts))])
    assert cosines(got, wrong).min() < 0.999


def _graphed_steps(engine: Engine, chunk, references: list[np.ndarray]) -> list[str]:
    """Two batches of the same texts through one bucket, each row's task different in the second:
    each row equals its own task's model both times. Returns how each ran."""
    rows = len(chunk.cu_seqlens) - 1
    runs = []
    for adapters in (_mixed(rows), [(a + 1) % (len(TASKS) + 1) for a in _mixed(rows)]):
        handle = engine.step(chunk.input_ids, chunk.cu_seqlens, adapters=np.array(adapters))
        want = np.stack([references[a][r] for r, a in enumerate(adapters)])
        got = handle.result()
        assert isinstance(got, np.ndarray)
        assert cosines(got, want).min() >= (0.9999 if engine.dtype == torch.float32 else 0.999), handle.run
        runs.append(handle.run)
    return runs


def test_static_batch_path_takes_each_batch_s_tasks(adapted, references):
    """The CUDA-graph path (fixed buffers refilled per batch; here on CPU its forward runs again in place
    of a replay): the adapters travel in the static buffers like the token ids."""
    info, chunk = _chunk(adapted, _texts())
    engine = Engine(
        info,
        "cpu",
        graphs=True,
        max_batch_tokens=4096,
        max_batch_seqs=32,
        capture=lambda engine, bucket: lambda: engine._static_forward(bucket),
    )
    assert _graphed_steps(engine, chunk, references) == ["captured", "replay"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_rows_of_mixed_tasks_eager_and_replayed(adapted, references):
    """float32 (SDPA, eager) to 0.9999; float16 through captured and replayed CUDA graphs to 0.999."""
    info, chunk = _chunk(adapted, _texts())
    adapters = _mixed(len(chunk.cu_seqlens) - 1)
    want = np.stack([references[a][r] for r, a in enumerate(adapters)])
    eager = Engine(info, "cuda", "float32", graphs=False)
    got = eager.step(chunk.input_ids, chunk.cu_seqlens, adapters=np.array(adapters)).result()
    assert isinstance(got, np.ndarray) and cosines(got, want).min() >= 0.9999
    graphed = Engine(info, "cuda", "float16", graphs=True, max_batch_tokens=4096, max_batch_seqs=32)
    assert _graphed_steps(graphed, chunk, references) == ["captured", "replay"]


def _published(adapted: Path, dest: Path) -> Path:
    """The folder as jina-embeddings-v3 publishes it: config model_type xlm-roberta, rotary positions and its
    custom code's keys; tensors under ``roberta.`` (XLMRobertaLoRA.roberta), the pooler's with adapters too."""
    out = shutil.copytree(adapted, dest)
    tensors = load_file(out / "model.safetensors")
    pooler = {
        "pooler.dense.parametrizations.weight.original": tensors.pop("pooler.dense.weight"),
        "pooler.dense.parametrizations.weight.0.lora_A": torch.zeros(len(TASKS), RANK, 64),
        "pooler.dense.parametrizations.weight.0.lora_B": torch.zeros(len(TASKS), 64, RANK),
    }
    save_file({f"roberta.{k}": v for k, v in (tensors | pooler).items()}, out / "model.safetensors")
    edit_config(
        out,
        model_type="xlm-roberta",
        architectures=["XLMRobertaModel"],
        auto_map={"AutoModel": "jinaai/xlm-roberta-flash-implementation--modeling_lora.XLMRobertaLoRA"},
        position_embedding_type="rotary",
        rotary_emb_base=20000.0,
        rope_parameters=None,
        task_instructions=JINA_V3_PROMPTS,
        load_trained_adapters=True,
        use_flash_attn=True,
    )
    return out


def test_published_config_form_gives_the_same_vectors(adapted, references, tmp_path):
    published = _published(adapted, tmp_path / "published")
    info = load_model_info(str(published))
    assert spec_from_folder(info).family == "JinaV3"
    texts = _texts()
    adapters = _mixed(len(texts))
    want = np.stack([references[a][r] for r, a in enumerate(adapters)])
    assert cosines(engine_rows(published, texts, adapters), want).min() >= 0.9999
    # the rope base is read from rotary_emb_base; without it, the custom code's default (10000) applies
    edit_config(published, rotary_emb_base=100.0)
    assert cosines(engine_rows(published, texts, adapters), want).min() < 0.999
    config = json.loads((published / "config.json").read_text())
    del config["rotary_emb_base"]
    inv_freq = jina_v3.JinaV3Encoder(jina_v3.spec(config)).rotary.inv_freq
    torch.testing.assert_close(inv_freq, 10000.0 ** -(torch.arange(0, HEAD_DIM, 2) / HEAD_DIM))


def test_xlm_roberta_with_rotary_positions_is_never_served_as_xlm_roberta():
    config = {"model_type": "xlm-roberta", "position_embedding_type": "rotary", "rotary_emb_base": 20000.0}
    assert family_for(config).name == "JinaV3"
    assert family_for({"position_embedding_type": "rotary"}).name == "JinaV3"  # an old copy names no model_type
    assert family_for({"model_type": "xlm-roberta"}).name == "XLM-RoBERTa"
    config |= {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128}
    with pytest.raises(ConfigError, match="only absolute position embeddings"):
        bert.spec(config | {"vocab_size": 100, "max_position_embeddings": 512})


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 20000.0}}, "rope type 'yarn'"),
        ({"rotary_emb_interleaved": True}, "rotary_emb_interleaved: true is not supported"),
        ({"rotary_emb_scale_base": 512}, r"rotary_emb_scale_base \(xPos scaling\) is not supported"),
        ({"rotary_emb_dim": 8}, "rotary_emb_dim below the head size is not supported"),
        ({"position_embedding_type": "absolute"}, "position_embedding_type 'absolute' is not supported"),
        ({"architectures": ["JinaEmbeddingsV3ForSequenceClassification"]}, "sequence classifiers are not served"),
        ({"lora_rank": 0}, "lora_rank must be a positive integer"),
    ],
)
def test_refuses_what_it_does_not_implement(adapted, tmp_path, changes, message):
    refused = shutil.copytree(adapted, tmp_path / "refused")
    edit_config(refused, **changes)
    with pytest.raises(ConfigError, match=message):
        spec_from_folder(load_model_info(str(refused)))


def _edit_tensors(folder: Path, dest: Path, edit) -> Path:
    out = shutil.copytree(folder, dest)
    tensors = load_file(out / "model.safetensors")
    edit(tensors)
    save_file(tensors, out / "model.safetensors")
    return out


def test_refuses_a_checkpoint_without_the_adapters_its_config_lists(adapted, folder, tmp_path):
    name = "encoder.layers.1.mlp.fc2.parametrizations.weight.0.lora_B"
    missing = _edit_tensors(adapted, tmp_path / "missing", lambda t: t.pop(name))
    with pytest.raises(ConfigError, match=f"missing tensor '{re.escape(name)}'"):
        Engine(load_model_info(str(missing)), "cpu")
    # the base model's folder with a config that lists adapters: no parametrized weights either
    listed = shutil.copytree(folder, tmp_path / "listed")
    edit_config(listed, lora_adaptations=TASKS)
    with pytest.raises(ConfigError, match=r"missing tensor 'embeddings\.word_embeddings\.parametrizations\.weight"):
        Engine(load_model_info(str(listed)), "cpu")


def test_refuses_misshapen_adapters(adapted, tmp_path):
    name = "encoder.layers.0.mixer.Wqkv.parametrizations.weight.0.lora_A"
    rank3 = _edit_tensors(adapted, tmp_path / "rank3", lambda t: t.update({name: t[name][:, :3].contiguous()}))
    with pytest.raises(ConfigError, match=rf"'{re.escape(name)}' has shape \(5, 3, 64\), expected \(5, 4, 64\)"):
        Engine(load_model_info(str(rank3)), "cpu")
    # the config lists four tasks, the checkpoint stacks five
    four = shutil.copytree(adapted, tmp_path / "four")
    edit_config(four, lora_adaptations=TASKS[:4])
    with pytest.raises(
        ConfigError, match=r"embeddings\.word_embeddings\.parametrizations\.weight\.0\.lora_A' has shape"
    ):
        Engine(load_model_info(str(four)), "cpu")
    config = json.loads((adapted / "config.json").read_text())
    assert config["lora_adaptations"] == TASKS  # the fixture itself untouched
