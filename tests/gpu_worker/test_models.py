"""Model families and weight formats against transformers' own implementation (random tiny models)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.engine.errors import InvalidTokens
from embedfleet.shared.model_dir.load import load_model_info
from tests.conftest import cosines


def _tiny_folder(tmp_path: Path, model, pooling: str | None, template: Path) -> Path:
    folder = tmp_path / model.config.model_type
    model.save_pretrained(folder, safe_serialization=True)
    shutil.copy(template / "tokenizer.json", folder / "tokenizer.json")  # required; ids are fed directly
    if pooling:
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": pooling}))
    return folder


def _hf_pooled(model, ids: list[np.ndarray], pooling: str) -> np.ndarray:
    """transformers forward on a padded batch, pooled with the attention mask."""
    width = max(len(s) for s in ids)
    pad = model.config.pad_token_id
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, s in enumerate(ids):
        input_ids[i, : len(s)] = torch.from_numpy(s)
        mask[i, : len(s)] = 1
    with torch.no_grad():
        hidden = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    if pooling == "cls":
        return hidden[:, 0].numpy()
    if pooling == "lasttoken":
        return torch.stack([hidden[i, len(s) - 1] for i, s in enumerate(ids)]).numpy()
    m = mask.unsqueeze(-1).float()
    return ((hidden * m).sum(1) / m.sum(1)).numpy()


def _packed(ids: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    cu = np.zeros(len(ids) + 1, np.int32)
    np.cumsum([len(s) for s in ids], out=cu[1:])
    return np.concatenate(ids).astype(np.int32), cu


def _random_ids(vocab: int, lengths: list[int], low: int = 5) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(low, vocab, size=n).astype(np.int32) for n in lengths]


LENGTHS = [7, 33, 1, 64, 12, 64]


@pytest.mark.parametrize("pooling", ["mean", "cls", "lasttoken"])
def test_xlm_roberta_with_offset_positions(tmp_path, model_info, pooling):
    from transformers import XLMRobertaConfig, XLMRobertaModel

    torch.manual_seed(0)
    config = XLMRobertaConfig(
        vocab_size=500,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=80,
        pad_token_id=1,
        type_vocab_size=1,
    )
    model = XLMRobertaModel(config, add_pooling_layer=False).eval()
    folder = _tiny_folder(tmp_path, model, pooling, model_info.path)
    info = load_model_info(str(folder))
    assert info.max_seq_length == 78  # 80 positions minus the two below the padding offset
    engine = Engine(info, "cpu")
    ids = _random_ids(500, LENGTHS)
    got = engine.embed(*_packed(ids))
    np.testing.assert_allclose(got, _hf_pooled(model, ids, pooling), atol=1e-4)


def test_bert_cls_pooling_against_transformers(tmp_path, model_info):
    from transformers import BertConfig, BertModel

    torch.manual_seed(1)
    config = BertConfig(
        vocab_size=300,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=80,
        max_position_embeddings=64,
        hidden_act="gelu_new",
    )
    model = BertModel(config, add_pooling_layer=True).eval()  # the pooler weights are ignored
    folder = _tiny_folder(tmp_path, model, "cls", model_info.path)
    engine = Engine(load_model_info(str(folder)), "cpu")
    ids = _random_ids(300, [5, 40, 17])
    np.testing.assert_allclose(engine.embed(*_packed(ids)), _hf_pooled(model, ids, "cls"), atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_weights_load_and_compute_in_fp32(tmp_path, model_info, dtype):
    folder = tmp_path / "half"
    shutil.copytree(model_info.path, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors = load_file(str(model_info.path / "model.safetensors"))
    save_file({k: v.to(dtype) for k, v in tensors.items()}, str(folder / "model.safetensors"))
    full = Engine(model_info, "cpu")
    half = Engine(load_model_info(str(folder)), "cpu")
    assert next(half.model.parameters()).dtype == torch.float32  # CPU computes in fp32
    ids = _random_ids(30000, [12, 50, 128], low=1000)
    c = cosines(half.embed(*_packed(ids)), full.embed(*_packed(ids)))
    assert c.min() >= 0.999, c.min()


def test_missing_tensor_is_a_clear_error(tmp_path, model_info):
    from embedfleet.shared.config.option import ConfigError

    folder = tmp_path / "broken"
    shutil.copytree(model_info.path, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors = load_file(str(model_info.path / "model.safetensors"))
    del tensors["encoder.layer.3.output.dense.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"missing tensor 'encoder.layer.3.output.dense.weight'"):
        Engine(load_model_info(str(folder)), "cpu")


def test_token_types_reach_the_model(tmp_path, model_info):
    from transformers import BertConfig, BertModel

    torch.manual_seed(2)
    config = BertConfig(
        vocab_size=300,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        type_vocab_size=2,
    )
    model = BertModel(config, add_pooling_layer=False).eval()
    folder = _tiny_folder(tmp_path, model, "cls", model_info.path)
    engine = Engine(load_model_info(str(folder)), "cpu")
    ids = _random_ids(300, [9, 14])
    types = [np.array([0] * 4 + [1] * 5, np.int32), np.array([0] * 6 + [1] * 8, np.int32)]
    input_ids, cu = _packed(ids)
    got = engine.embed(input_ids, cu, np.concatenate(types))
    with torch.no_grad():
        want = [
            model(input_ids=torch.from_numpy(i).long()[None], token_type_ids=torch.from_numpy(t).long()[None])
            .last_hidden_state[0, 0]
            .numpy()
            for i, t in zip(ids, types)
        ]
    np.testing.assert_allclose(got, np.stack(want), atol=1e-4)
    assert not np.allclose(got, engine.embed(input_ids, cu), atol=1e-3)  # the types matter
    with pytest.raises(InvalidTokens, match=r"row 0 has token types outside \[0, 2\)"):
        engine.check(input_ids, cu, np.full(len(input_ids), 2, np.int32))


def test_prompts_equal_sentence_transformers(tmp_path, model_info):
    from sentence_transformers import SentenceTransformer

    from embedfleet.services.gpu_worker.engine.pooling import postprocess
    from embedfleet.services.tokenizer.encoder import TextEncoder, pack_chunks
    from embedfleet.shared.protocol import EmbedOptions

    folder = tmp_path / "prompted"
    shutil.copytree(model_info.path, folder)
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "query: ", "document": "passage: "}})
    )
    info = load_model_info(str(folder))
    texts = ["what is a list comprehension", "Generators yield values one at a time."]
    encoder, engine = TextEncoder(info), Engine(info, "cpu")
    reference = SentenceTransformer(str(folder), device="cpu")
    for name in ("query", "document"):
        ids = encoder.encode(encoder.with_prompt(texts, EmbedOptions(prompt_name=name)))
        chunk = next(pack_chunks(ids, 4096, 64))
        ours = postprocess(engine.embed(chunk.input_ids, chunk.cu_seqlens), True, None, np.float32)
        want = reference.encode(texts, prompt_name=name)
        assert cosines(ours, want).min() >= 0.9999
        assert cosines(ours, reference.encode(texts)).min() < 0.9999  # the prompt changed the vectors


def test_bf16_compute_on_cpu_stays_close_to_the_reference(model_info, reference):
    """--dtype bfloat16 on CPU: vectors within cosine 0.999 of sentence-transformers (fp32)."""
    from embedfleet.services.tokenizer.encoder import TextEncoder, pack_chunks
    from tests.support.corpus import mixed_texts

    texts = mixed_texts(64)
    engine = Engine(model_info, "cpu", "bfloat16")
    assert next(engine.model.parameters()).dtype == torch.bfloat16
    # oneDNN's packed bf16 GEMMs where the CPU has bf16 instructions (1.5-2x F.linear's), else F.linear
    assert engine.linear_ops.name == ("onednn" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "torch")
    (chunk,) = pack_chunks(TextEncoder(model_info).encode(texts), 1 << 20, 1024)
    got = engine.embed(chunk.input_ids, chunk.cu_seqlens)
    assert got.dtype == np.float32
    c = cosines(got, reference.encode(texts))
    assert c.min() >= 0.999, c.min()
