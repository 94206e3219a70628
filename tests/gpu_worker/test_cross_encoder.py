"""Cross-encoders (sequence-classification checkpoints) against transformers: random tiny models
saved as Hugging Face folders, pairs with token type ids, logits equal within 1e-4."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.shared.model_dir.load import load_model_info
from tests.gpu_worker.test_models import _packed, _random_ids, _tiny_folder

LENGTHS = [9, 40, 3, 64, 17]


def _hf_logits(model, ids: list[np.ndarray], types: list[np.ndarray] | None) -> np.ndarray:
    width = max(len(s) for s in ids)
    input_ids = torch.full((len(ids), width), model.config.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    type_ids = torch.zeros((len(ids), width), dtype=torch.long)
    for i, s in enumerate(ids):
        input_ids[i, : len(s)] = torch.from_numpy(s)
        mask[i, : len(s)] = 1
        if types is not None:
            type_ids[i, : len(s)] = torch.from_numpy(types[i])
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=mask, token_type_ids=type_ids).logits.numpy()


@pytest.mark.parametrize("labels", [1, 3])
def test_bert_for_sequence_classification(tmp_path, model_info, labels):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=300,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=80,
        num_labels=labels,
    )
    model = BertForSequenceClassification(config).eval()
    folder = _tiny_folder(tmp_path, model, None, model_info.path)
    info = load_model_info(str(folder))
    assert info.scores and info.dim == labels and not info.normalize
    engine = Engine(info, "cpu")
    assert engine.dim == labels
    ids = _random_ids(300, LENGTHS)
    # (query, document) pairs: segment 0 then segment 1
    types = [np.array([0] * (len(s) // 2) + [1] * (len(s) - len(s) // 2), np.int32) for s in ids]
    flat, cu = _packed(ids)
    got = engine.embed(flat, cu, np.concatenate(types))
    want = _hf_logits(model, ids, types)
    assert got.shape == (len(ids), labels)
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert np.ptp(want[:, 0]) > 1e-3  # the scores differ, so the comparison means something


def test_xlm_roberta_for_sequence_classification(tmp_path, model_info):
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    torch.manual_seed(1)
    config = XLMRobertaConfig(
        vocab_size=300,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=80,
        pad_token_id=1,
        type_vocab_size=1,
        num_labels=1,
    )
    model = XLMRobertaForSequenceClassification(config).eval()
    folder = _tiny_folder(tmp_path, model, None, model_info.path)
    engine = Engine(load_model_info(str(folder)), "cpu")
    ids = _random_ids(300, LENGTHS)
    got = engine.embed(*_packed(ids))
    np.testing.assert_allclose(got, _hf_logits(model, ids, None), atol=1e-4)


def test_a_checkpoint_without_its_head_is_refused(tmp_path, model_info):
    from safetensors.torch import load_file, save_file
    from transformers import BertConfig, BertForSequenceClassification

    from embedfleet.shared.config.option import ConfigError

    config = BertConfig(
        vocab_size=300,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=80,
        num_labels=1,
    )
    folder = _tiny_folder(tmp_path, BertForSequenceClassification(config), None, model_info.path)
    weights = folder / "model.safetensors"
    save_file({k: v for k, v in load_file(weights).items() if not k.startswith("classifier")}, weights)
    with pytest.raises(ConfigError, match="classifier"):
        Engine(load_model_info(str(folder)), "cpu")
