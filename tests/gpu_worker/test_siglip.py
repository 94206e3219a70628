"""SigLIP through the engine against transformers' SiglipModel on the same inputs: the text tower on
rows the tokenizer pads to 64 tokens (as SigLIP's processor pads them, unmasked), pooled at the last
position and projected by its head; the image tower through its attention-pooling head; cosine >= 0.9999
in fp32, and the same scale."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.tokenizer.encoder import TextEncoder, pack_chunks
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.images.preprocess import ImageProcessing
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.protocol import EmbedOptions
from tests.support.engine_folders import edit_config
from tests.support.image_models import SIGLIP_TEXT, build_siglip

TEXTS = ["a photo of a cat", "two dogs playing in the snow on a bright winter morning", "x", "red " * 80]
COSINE = 0.9999


@pytest.fixture(scope="module")
def siglip(tmp_path_factory):
    from transformers import SiglipImageProcessor, SiglipModel

    folder = build_siglip(tmp_path_factory.mktemp("siglip"))
    return folder, SiglipModel.from_pretrained(str(folder)).eval(), SiglipImageProcessor.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def engine(siglip):
    return Engine(load_model_info(str(siglip[0])), "cpu")


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_a_siglip_folder_reads_as_two_towers_with_padded_texts(siglip):
    info = load_model_info(str(siglip[0]))
    assert (info.inputs, info.dim, info.pooling, info.normalize) == (("text", "image"), 48, "lasttoken", False)
    assert (info.max_seq_length, info.pad_to, info.pad_id, info.image_tokens) == (64, 64, 0, 16)


def test_text_vectors_equal_get_text_features_on_padded_rows(siglip, engine):
    _, model, _ = siglip
    encoder = TextEncoder(engine.info)
    ids = encoder.encode(encoder.with_prompt(TEXTS, EmbedOptions()))
    assert {len(row) for row in ids} == {SIGLIP_TEXT["max_position_embeddings"]}  # every row padded to 64
    (chunk,) = pack_chunks(ids, 1 << 20, 1024)
    ours = engine.embed(chunk.input_ids, chunk.cu_seqlens)
    with torch.inference_mode():
        padded = torch.tensor(np.array(ids, dtype=np.int64))
        theirs = model.get_text_features(input_ids=padded).pooler_output.numpy()  # unmasked, as the processor feeds it
    assert _cosines(ours, theirs).min() >= COSINE, _cosines(ours, theirs)
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)


def test_image_vectors_equal_get_image_features(siglip, engine):
    _, model, processor = siglip
    rng = np.random.default_rng(0)
    images = [
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in [(32, 32), (70, 20), (9, 120)]
    ]
    processing = ImageProcessing.from_folder(siglip[0])
    ours = engine.step_images(np.stack([processing.pixels(image) for image in images])).result()
    with torch.inference_mode():
        pixels = processor(images=images, return_tensors="pt")["pixel_values"]
        theirs = model.get_image_features(pixel_values=pixels).pooler_output.numpy()
    assert ours.shape == (3, 48)
    assert _cosines(ours, theirs).min() >= COSINE, _cosines(ours, theirs)
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)
    assert engine.image_tokens == 16  # no class token: the patches alone


def test_token_inputs_are_padded_too(siglip, engine):
    encoder = TextEncoder(engine.info)
    (row,) = encoder.check_ids([np.array([2023, 102], np.int32)])
    assert len(row) == 64 and row[:2].tolist() == [2023, 102] and set(row[2:].tolist()) == {0}


def test_a_headless_folder_or_naflex_config_over_a_fixed_processor_is_refused_naming_why(siglip, tmp_path):
    folder = shutil.copytree(siglip[0], tmp_path / "headless")
    config = load_model_info(str(folder))  # reads as served before the edit
    assert config.inputs == ("text", "image")
    vision = json.loads((folder / "config.json").read_text())["vision_config"]
    edit_config(folder, vision_config={**vision, "vision_use_head": False})
    with pytest.raises(ConfigError, match="no pooling head"):
        Engine(load_model_info(str(folder)), "cpu")
    edit_config(folder, model_type="siglip2")
    with pytest.raises(ConfigError, match="NaFlex"):
        Engine(load_model_info(str(folder)), "cpu")
