"""Sparse (SPLADE, BGE-M3), multi-vector (ColBERT-style, BGE-M3) and token outputs of the engine,
against sentence-transformers' SparseEncoder / MultiVectorEncoder and BGE-M3's own modules, on tiny
random checkpoints (CPU, float32). Tolerances: 1e-4 absolute on values, cosine >= 0.9999 on vectors,
and the same nonzero set for sparse vectors."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.ragged import sparse_rows, split_inputs, token_rows
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.load import load_model_info
from tests.conftest import cosines
from tests.support.output_models import (
    bge_m3_reference,
    build_bge_m3,
    build_colbert,
    build_splade,
    colbert_reference,
    densify,
    splade_reference,
)

TEXTS = [
    "hello world, a test!",
    "the quick brown fox jumps over the lazy dog.",
    "x",
    "search: sparse, dense; multi-vector?",
]
ATOL = 1e-4
COSINE = 0.9999


def _packed(folder, texts):
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = [tokenizer.encode(t).ids for t in texts]
    cu = np.concatenate([[0], np.cumsum([len(i) for i in ids])]).astype(np.int32)
    return np.concatenate(ids).astype(np.int32), cu


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("outputs")


@pytest.mark.parametrize("pooling,activation", [("max", "relu"), ("sum", "log1p_relu")])
def test_splade_equals_sparse_encoder(root, pooling, activation):
    folder = build_splade(root, pooling, activation)
    info = load_model_info(str(folder))
    assert info.outputs == ("sparse",) and info.sparse.pooling == pooling and info.dim == info.vocab_size
    ids, cu = _packed(folder, TEXTS)
    made = Engine(info, "cpu").step(ids, cu, outputs=("sparse",)).result()["sparse"]
    ref = splade_reference(folder, TEXTS)
    assert made.shape == ref.shape
    assert np.array_equal(made > 0, ref > 0), "the nonzero sets differ"
    assert np.abs(made - ref).max() < ATOL * max(1.0, np.abs(ref).max())
    assert cosines(made, ref).min() >= COSINE


def test_colbert_equals_multi_vector_encoder(root):
    folder = build_colbert(root)
    info = load_model_info(str(folder))
    assert info.outputs == ("multivector",) and info.multivector.dim == 16 and info.multivector.skiplist_ids
    ids, cu = _packed(folder, TEXTS)
    vectors = Engine(info, "cpu").step(ids, cu, outputs=("multivector",)).result()["multivector"]
    for task in ("query", "document"):
        drop = np.asarray(info.multivector.skiplist_ids) if task in info.multivector.skiplist_tasks else None
        offsets, rows = token_rows(vectors, ids, cu, drop_ids=drop)
        ref = colbert_reference(folder, TEXTS, task)
        for i, expected in enumerate(ref):
            got = rows[offsets[i] : offsets[i + 1]]
            assert got.shape == expected.shape, (task, i)
            assert cosines(got, expected).min() >= COSINE
    # the skiplist drops punctuation from documents only
    assert len(token_rows(vectors, ids, cu, drop_ids=np.asarray(info.multivector.skiplist_ids))[1]) < len(vectors)


def test_bge_m3_three_outputs_from_one_pass(root):
    folder = build_bge_m3(root)
    info = load_model_info(str(folder))
    assert info.outputs == ("dense", "sparse", "multivector") and info.pooling == "cls"
    ids, cu = _packed(folder, TEXTS)
    made = Engine(info, "cpu").step(ids, cu, outputs=("dense", "multivector", "sparse")).result()
    ref = bge_m3_reference(folder, TEXTS)
    dense = made["dense"] / np.linalg.norm(made["dense"], axis=1, keepdims=True)
    assert cosines(dense, np.stack(ref["dense"])).min() >= COSINE
    for i, lexical in enumerate(ref["sparse"]):
        row = made["sparse"][i]
        assert set(np.flatnonzero(row).tolist()) == set(lexical), i
        assert np.allclose([row[t] for t in lexical], list(lexical.values()), atol=ATOL)
    offsets, rows = token_rows(made["multivector"], ids, cu, skip_first=True)
    for i, expected in enumerate(ref["colbert"]):
        got = rows[offsets[i] : offsets[i + 1]]
        assert got.shape == expected.shape and cosines(got, expected).min() >= COSINE


def test_tokens_are_the_last_hidden_states(root):
    import torch
    from transformers import AutoModel

    folder = build_bge_m3(root / "tokens")
    ids, cu = _packed(folder, TEXTS[:2])
    made = Engine(load_model_info(str(folder)), "cpu").step(ids, cu, outputs=("tokens",)).result()["tokens"]
    model = AutoModel.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        for i in range(2):
            h = model(torch.tensor([ids[cu[i] : cu[i + 1]]], dtype=torch.long)).last_hidden_state[0].numpy()
            assert np.abs(made[cu[i] : cu[i + 1]] - h).max() < ATOL


def test_sparse_pruning():
    rng = np.random.default_rng(0)
    dense = np.maximum(rng.normal(size=(5, 50)), 0).astype(np.float32)
    dense[2] = 0.0  # a row with nothing left
    offsets, indices, values = sparse_rows(dense)
    for i in range(5):
        assert np.array_equal(
            densify(indices[offsets[i] : offsets[i + 1]], values[offsets[i] : offsets[i + 1]], 50), dense[i]
        )
    offsets, indices, values = sparse_rows(dense, threshold=0.5, top_k=3)
    for i in range(5):
        got = dict(zip(indices[offsets[i] : offsets[i + 1]].tolist(), values[offsets[i] : offsets[i + 1]].tolist()))
        order = np.argsort(-dense[i], kind="stable")
        expected = {int(j): float(dense[i, j]) for j in order[:3] if dense[i, j] > 0.5}
        assert got == pytest.approx(expected)
        assert list(got) == sorted(got)  # indices ascend


def test_split_inputs_keeps_parts_under_budget():
    offsets = np.array([0, 3, 3, 10, 12], dtype=np.int32)
    parts = split_inputs(offsets, 4, 30)
    assert parts[0][0] == 0 and parts[-1][1] == 4
    assert all(a < b for a, b in parts) and all(parts[i][1] == parts[i + 1][0] for i in range(len(parts) - 1))
    assert all((offsets[b] - offsets[a]) * 4 <= 30 for a, b in parts)
    with pytest.raises(ValueError, match="over the 20 bytes"):
        split_inputs(offsets, 4, 20)


def test_unsupported_stacks_are_refused(root):
    import json
    import shutil

    folder = root / "splade-extra"
    shutil.copytree(build_splade(root / "refuse"), folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append(
        {
            "idx": 2,
            "name": "2",
            "path": "",
            "type": "sentence_transformers.sparse_encoder.modules.SparseStaticEmbedding",
        }
    )
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ConfigError, match="MLMTransformer -> SpladePooling"):
        load_model_info(str(folder))
    colbert = root / "colbert-expansion"
    shutil.copytree(build_colbert(root / "refuse"), colbert)
    config = json.loads((colbert / "sentence_bert_config.json").read_text())
    (colbert / "sentence_bert_config.json").write_text(
        json.dumps({**config, "query_expansion": {"strategy": "mask", "length": 32}})
    )
    with pytest.raises(ConfigError, match="query_expansion"):
        load_model_info(str(colbert))


@pytest.mark.parametrize(
    "build,message",
    [
        (build_splade, "modules.json runs MLMTransformer ->  -> SpladePooling: of sparse encoders only"),
        (build_colbert, "modules.json module '' is not supported in a multi-vector encoder"),
    ],
)
def test_a_modules_json_entry_that_is_no_object_is_refused(root, build, message):
    import json
    import shutil

    folder = root / f"{build.__name__}-odd-entry"
    shutil.copytree(build(root / "odd"), folder)
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps([modules[0], 7, *modules[1:]]))
    with pytest.raises(ConfigError, match=message):
        load_model_info(str(folder))


def test_bge_m3_heads_as_torch_pickles_are_not_loaded(root, caplog):
    """FlagEmbedding's .pt heads are pickles: never loaded; the folder serves dense vectors and says how to convert."""
    import shutil

    folder = root / "bge-m3-pickled"
    shutil.copytree(build_bge_m3(root / "pickled"), folder)
    for name in ("sparse_linear", "colbert_linear"):
        (folder / f"{name}.safetensors").rename(folder / f"{name}.pt")
    with caplog.at_level("WARNING"):
        info = load_model_info(str(folder))
    assert info.outputs == ("dense",)
    assert "save_file(torch.load(" in caplog.text and "colbert_linear.pt" in caplog.text
