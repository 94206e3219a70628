"""GTE folders (tiny random GteModel checkpoints saved by transformers, in sentence-transformers modules)
through the tokenizer and one packed engine batch of texts of many lengths: vectors equal to
sentence-transformers' (cosine >= 0.9999 in fp32), with the published NTK rope scaling, the older
NewModel naming, and a clear refusal of a scaling the engine does not implement."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from embedfleet.services.gpu_worker.engine.models.registry import spec_from_folder
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.load import load_model_info
from tests.conftest import cosines
from tests.support.corpus import mixed_texts
from tests.support.engine_folders import edit_config, engine_vectors
from tests.support.tiny_models import build, st_reference

NTK_FACTOR = 2.0
HEAD_DIM = 16  # the tiny model's 64 / 4


@pytest.fixture(scope="module")
def gte_folder(tmp_path_factory) -> Path:
    return build("gte", tmp_path_factory.mktemp("gte"))


def _texts() -> list[str]:
    texts = mixed_texts(16)  # queries to whole documents: some cut at the model's 256 tokens
    assert len({len(t) for t in texts}) > 8
    return texts


@pytest.mark.parametrize("prompt_name", [None, "query"])
def test_gte_vectors_equal_sentence_transformers(gte_folder, prompt_name):
    texts = _texts()
    got = engine_vectors(gte_folder, texts, prompt_name)
    want = st_reference(gte_folder, texts, prompt_name=prompt_name)
    assert cosines(got, want).min() >= 0.9999
    assert cosines(got, got[::-1]).min() < 0.99  # different texts, clearly different vectors


def test_gte_ntk_rope_scaling_as_gte_en_v1_5_publishes_it(gte_folder, tmp_path):
    """``rope_scaling: {type: ntk, factor: 2}`` (gte-base-en-v1.5's): theta * 2 and every frequency divided
    by 2^(2 / head_dim), at any length. transformers 5 has no "ntk" type: the reference is its linear
    scaling with those numbers, which computes the same frequencies."""
    texts = _texts()
    reference = shutil.copytree(gte_folder, tmp_path / "linear")
    edit_config(
        reference,
        rope_parameters={
            "rope_type": "linear",
            "rope_theta": 160000.0 * NTK_FACTOR,
            "factor": NTK_FACTOR ** (2 / HEAD_DIM),
        },
    )
    ntk = shutil.copytree(gte_folder, tmp_path / "ntk")
    edit_config(ntk, rope_parameters=None, rope_theta=160000.0, rope_scaling={"type": "ntk", "factor": NTK_FACTOR})
    got = engine_vectors(ntk, texts)
    assert cosines(got, st_reference(reference, texts)).min() >= 0.9999
    assert cosines(got, st_reference(gte_folder, texts)).min() < 0.9999  # the scaling changed the vectors


def test_gte_older_newmodel_checkpoint(gte_folder, tmp_path):
    """model_type "new", architecture NewModel, tensors under "new.": the same vectors."""
    folder = shutil.copytree(gte_folder, tmp_path / "new")
    tensors = load_file(folder / "model.safetensors")
    save_file({f"new.{name}": t for name, t in tensors.items()}, folder / "model.safetensors")
    edit_config(folder, model_type="new", architectures=["NewModel"])
    texts = _texts()
    np.testing.assert_allclose(engine_vectors(folder, texts), engine_vectors(gte_folder, texts), atol=1e-6)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"rope_scaling": {"type": "yarn", "factor": 2.0}}, "GTE rope scaling 'yarn' is not supported"),
        ({"rope_scaling": {"type": "ntk", "factor": 2.0, "mixed_b": 1.0}}, "'ntk' with mixed_b is not supported"),
        ({"logn_attention_scale": True}, "logn_attention_scale is not supported"),
    ],
)
def test_gte_refuses_what_it_does_not_implement(gte_folder, tmp_path, changes, message):
    folder = shutil.copytree(gte_folder, tmp_path / "refused")
    edit_config(folder, rope_parameters=None, rope_theta=160000.0, **changes)
    with pytest.raises(ConfigError, match=message):
        spec_from_folder(load_model_info(str(folder)))
