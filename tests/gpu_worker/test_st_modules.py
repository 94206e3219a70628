"""Pooling + Dense + Normalize against sentence-transformers itself, on a model it saved."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from embedfleet.services.gpu_worker.engine.batch import DeviceBatch, prepare
from embedfleet.services.gpu_worker.engine.pooling import POOLING_MODES, pool
from embedfleet.services.gpu_worker.engine.st_modules import DenseStack, build_dense
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.info import ModelInfo
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.model_dir.stack import DenseSpec
from tests.conftest import cosines


class _Imported:
    """A module imported on first use: sentence-transformers takes seconds to import, which every
    collection of the suite would pay."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        import importlib

        if attr.startswith("_"):  # pytest's collection looks for markers and __test__: not a reason to import
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)


st_modules = _Imported("sentence_transformers.sentence_transformer.modules")
st = _Imported("sentence_transformers")

CPU = torch.device("cpu")
TEXTS = [
    "A man is eating food.",
    "hi",
    "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest at night.",
    "Embeddings map text to vectors.",
]
# our mode names -> sentence-transformers'
ST_MODES = {
    "mean": "mean",
    "cls": "cls",
    "lasttoken": "lasttoken",
    "max": "max",
    "weightedmean": "weightedmean",
    "mean_sqrt_len": "mean_sqrt_len_tokens",
}


@pytest.fixture(scope="module")
def transformer(model_info: ModelInfo):
    return st_modules.Transformer(str(model_info.path))


@pytest.fixture(scope="module")
def dense_layers():
    torch.manual_seed(0)
    return [
        st_modules.Dense(384, 128, bias=True, activation_function=torch.nn.Tanh()),
        st_modules.Dense(128, 64, bias=False, activation_function=torch.nn.Identity()),
    ]


def _reference(transformer, dense_layers, mode: str, **kwargs):
    modules = [transformer, st_modules.Pooling(384, ST_MODES[mode]), *dense_layers, st_modules.Normalize()]
    return st.SentenceTransformer(modules=modules, device="cpu", **kwargs)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, transformer, dense_layers) -> Path:
    """A model sentence-transformers saved: Transformer -> Pooling(weightedmean) -> Dense -> Dense -> Normalize."""
    folder = tmp_path_factory.mktemp("st") / "tiny-dense"
    model = _reference(
        transformer,
        dense_layers,
        "weightedmean",
        prompts={"query": "query: ", "document": ""},
        default_prompt_name="query",
        truncate_dim=32,
    )
    model.save(str(folder))
    return folder


@pytest.fixture(scope="module")
def packed(transformer):
    """The reference's own token states for TEXTS: hidden [N, 384] packed, cu_seqlens [R + 1], input_ids [N],
    and the padded states [R, T, 384] with their attention mask [R, T]."""
    reference = st.SentenceTransformer(modules=[transformer, st_modules.Pooling(384, "mean")], device="cpu")
    features = reference.preprocess(TEXTS)
    with torch.no_grad():
        tokens = transformer(dict(features))["token_embeddings"]  # [R, T, 384], right-padded
    mask = features["attention_mask"].bool()
    lengths = mask.sum(1)
    assert len(set(lengths.tolist())) > 1, "texts of several lengths, so padding would show"
    cu = np.concatenate([[0], np.cumsum(lengths.numpy())]).astype(np.int32)
    return tokens[mask].float(), cu, features["input_ids"][mask].numpy(), tokens, features["attention_mask"]


def test_saved_model_is_read(saved):
    modules = json.loads((saved / "modules.json").read_text())
    # what sentence-transformers 6 writes; the names are what load_model_info must accept
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Dense", "Dense", "Normalize"]
    info = load_model_info(str(saved))
    assert info.dense == (
        DenseSpec(
            path=saved / "2_Dense" / "model.safetensors",
            in_features=384,
            out_features=128,
            bias=True,
            activation="tanh",
        ),
        DenseSpec(
            path=saved / "3_Dense" / "model.safetensors",
            in_features=128,
            out_features=64,
            bias=False,
            activation="identity",
        ),
    )
    assert (info.pooling, info.include_prompt, info.dim, info.pooled_dim, info.normalize) == (
        "weightedmean",
        True,
        64,
        384,
        True,
    )
    assert (info.prompts, info.default_prompt, info.truncate_dim) == ({"query": "query: ", "document": ""}, "query", 32)


@pytest.mark.parametrize("padded", [False, True], ids=["exact", "padded"])
@pytest.mark.parametrize("mode", POOLING_MODES)
def test_pool_dense_normalize_matches_encode(saved, transformer, dense_layers, packed, mode, padded):
    expected = _reference(transformer, dense_layers, mode).encode(TEXTS, convert_to_numpy=True)
    hidden, cu, input_ids, _, _ = packed
    rows, tokens = len(cu) - 1, len(input_ids)
    if padded:  # as a CUDA-graph bucket: a dummy row of pad tokens (garbage states), then empty rows
        host = prepare(input_ids, cu, 0, pad_to=tokens + 7, rows_to=rows + 3)
        hidden = torch.cat([hidden, 1e4 * torch.randn(7, hidden.shape[1])])
    else:
        host = prepare(input_ids, cu, 0)
    info = dataclasses.replace(load_model_info(str(saved)), pooling=mode)
    dense = build_dense(info, CPU)
    with torch.no_grad():
        out = torch.nn.functional.normalize(dense(pool(hidden, DeviceBatch(host, CPU), mode)), dim=-1)
    assert out.shape == (host.cu_seqlens.shape[0] - 1, 64)
    assert torch.isfinite(out).all()
    got = out[:rows].numpy()
    assert cosines(got, expected).min() >= 0.9999
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_pool_matches_sentence_transformers_pooling_before_dense(transformer, packed):
    """Without the Dense layers' squashing: the pooled vectors themselves, every mode."""
    hidden, cu, input_ids, _, _ = packed
    batch = DeviceBatch(prepare(input_ids, cu, 0), CPU)
    for mode in POOLING_MODES:
        reference = st.SentenceTransformer(modules=[transformer, st_modules.Pooling(384, ST_MODES[mode])], device="cpu")
        expected = reference.encode(TEXTS, convert_to_numpy=True)
        np.testing.assert_allclose(pool(hidden, batch, mode).numpy(), expected, atol=1e-5, err_msg=mode)


@pytest.mark.parametrize("mode", POOLING_MODES)
def test_pool_matches_pooling_module_on_shifted_states(packed, mode):
    """sentence-transformers' Pooling module on the padded states, shifted so every value is negative
    (a max that starts from zero, or a sum that lets pad positions in, shows)."""
    _, cu, input_ids, tokens, mask = packed
    shifted = tokens - tokens.amax() - 1.0  # every value <= -1
    expected = st_modules.Pooling(384, ST_MODES[mode])({"token_embeddings": shifted, "attention_mask": mask})
    host = prepare(input_ids, cu, 0, pad_to=len(input_ids) + 5, rows_to=len(cu) + 2)
    hidden = torch.cat([shifted[mask.bool()], torch.full((5, 384), 50.0)])  # the dummy row's pad tokens
    got = pool(hidden, DeviceBatch(host, CPU), mode)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[: len(cu) - 1], expected["sentence_embedding"], atol=1e-5, rtol=1e-5)


def _dense_folder(model_info: ModelInfo, folder: Path, dense) -> Path:
    """The default model's JSON files with one Dense module saved by sentence-transformers."""
    shutil.copytree(model_info.path, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    (folder / "2_Dense").mkdir()
    dense.save(str(folder / "2_Dense"))
    modules = json.loads((folder / "modules.json").read_text())
    modules.insert(
        2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.base.modules.dense.Dense"}
    )
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder


@pytest.mark.parametrize("activation", ["Identity", "Tanh", "ReLU", "GELU", "Sigmoid", "SiLU"])
def test_every_activation_matches_sentence_transformers_dense(model_info, tmp_path, activation):
    torch.manual_seed(1)
    dense = st_modules.Dense(384, 16, bias=True, activation_function=getattr(torch.nn, activation)())
    info = load_model_info(str(_dense_folder(model_info, tmp_path / "m", dense)))
    assert json.loads((tmp_path / "m" / "2_Dense" / "config.json").read_text())["activation_function"].endswith(
        activation
    )
    assert (info.dense[0].activation, info.dim) == (activation.lower(), 16)
    x = torch.randn(5, 384)
    with torch.no_grad():
        expected = dense({"sentence_embedding": x})["sentence_embedding"]
        torch.testing.assert_close(build_dense(info, CPU)(x), expected, atol=1e-6, rtol=1e-5)


def test_no_dense_layers_builds_nothing(model_info):
    assert build_dense(model_info, CPU) is None


def _spec(tmp_path: Path, tensors: dict[str, torch.Tensor], bias: bool = True) -> DenseSpec:
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    return DenseSpec(path=path, in_features=16, out_features=8, bias=bias, activation="tanh")


def test_dense_weight_errors_name_the_file(tmp_path):
    weight, bias = torch.zeros(8, 16), torch.zeros(8)
    spec = _spec(tmp_path, {"linear.weight": weight})
    with pytest.raises(ConfigError) as caught:
        DenseStack((spec,))
    assert str(caught.value) == f"{spec.path} lacks linear.bias (has linear.weight)"
    spec = _spec(tmp_path, {"linear.weight": torch.zeros(8, 12), "linear.bias": bias})
    with pytest.raises(ConfigError) as caught:
        DenseStack((spec,))
    assert str(caught.value) == f"{spec.path}: linear.weight has shape [8, 12], the Dense config says [8, 16]"
    missing = dataclasses.replace(spec, path=tmp_path / "gone" / "model.safetensors")
    with pytest.raises(ConfigError, match=r"gone/model.safetensors is missing"):
        DenseStack((missing,))
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 12)
    with pytest.raises(ConfigError, match=r"cannot read .*model.safetensors"):
        DenseStack((spec,))


def test_half_precision_weights_run_in_float32(tmp_path):
    torch.manual_seed(2)
    weight = torch.randn(8, 16).half()
    stack = DenseStack((_spec(tmp_path, {"linear.weight": weight}, bias=False),))
    x = torch.randn(3, 16)
    with torch.no_grad():
        out = stack(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tanh(x @ weight.float().T))


@pytest.mark.parametrize("mode", POOLING_MODES)
def test_include_prompt_false_skips_the_prompt_as_sentence_transformers_does(transformer, dense_layers, tmp_path, mode):
    """INSTRUCTOR-style pooling: the tokenizer counts the prompt's tokens, the engine pools without them
    (cls then takes the first token after the prompt); equal to encode(prompt_name=...) in every mode."""
    from embedfleet.services.gpu_worker.engine import Engine
    from embedfleet.services.tokenizer.encoder import TextEncoder
    from embedfleet.shared.protocol import EmbedOptions

    modules = [
        transformer,
        st_modules.Pooling(384, ST_MODES[mode], include_prompt=False),
        *dense_layers,
        st_modules.Normalize(),
    ]
    reference = st.SentenceTransformer(modules=modules, device="cpu", prompts={"query": "represent the query: "})
    reference.save(str(tmp_path / "instructor"))
    info = load_model_info(str(tmp_path / "instructor"))
    assert info.include_prompt is False
    encoder, engine = TextEncoder(info), Engine(info, "cpu")
    options = EmbedOptions(input_type="query")
    skip = encoder.prompt_tokens(options)
    assert skip == 5  # [CLS] represent the query :
    assert encoder.prompt_tokens(EmbedOptions()) == 0  # no prompt: nothing skipped
    ids = encoder.encode(encoder.with_prompt(TEXTS, options))
    cu = np.concatenate([[0], np.cumsum([len(s) for s in ids])]).astype(np.int32)
    got = engine.embed(np.concatenate(ids).astype(np.int32), cu, skip=np.full(len(ids), skip, np.int32))
    want = reference.encode(TEXTS, prompt_name="query")
    c = cosines(got, want)
    assert c.min() >= 0.9999, c
    if mode not in ("lasttoken",):  # the prompt changes the pooled vector in every mode but the last token's
        plain = engine.embed(np.concatenate(ids).astype(np.int32), cu)
        assert cosines(plain, want).min() < 0.9999
