"""SigLIP 2 NaFlex through the engine against transformers' Siglip2Model on the same inputs: images of
several aspects, each at its own grid of patches (positions resized up and down from the learnt 4 x 4),
several in one batch, prepared by shared/images/naflex.py and finished on the worker's side; the pixels
equal to Siglip2ImageProcessor's bit for bit, the vectors cosine >= 0.9999 in fp32; the text tower as
SigLIP's; forged patch rows refused by ``check_pages``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.engine.errors import InvalidTokens
from embedfleet.services.tokenizer.encoder import TextEncoder, pack_chunks
from embedfleet.shared.images.naflex import NaFlexProcessing
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.protocol import EmbedOptions
from tests.support.image_models import build_siglip2

COSINE = 0.9999
SIZES = [(32, 32), (70, 20), (9, 120), (200, 150), (8, 8), (41, 33)]  # (width, height)


@pytest.fixture(scope="module")
def siglip2(tmp_path_factory):
    from transformers import Siglip2ImageProcessor, Siglip2Model

    folder = build_siglip2(tmp_path_factory.mktemp("siglip2"))
    return folder, Siglip2Model.from_pretrained(str(folder)).eval(), Siglip2ImageProcessor.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def engine(siglip2):
    return Engine(load_model_info(str(siglip2[0])), "cpu")


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _images(seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in SIZES]


def _prepared(folder, images):
    processing = NaFlexProcessing.from_folder(folder)
    made = [processing.prepare(image) for image in images]
    return processing, np.concatenate([rows for rows, _ in made]), np.array([grid for _, grid in made], np.int32)


def test_a_naflex_folder_reads_as_two_towers_of_patch_images(siglip2):
    info = load_model_info(str(siglip2[0]))
    assert (info.inputs, info.dim, info.patch_images, info.image_tokens) == (("text", "image"), 48, True, 24)
    assert (info.pad_to, info.max_seq_length) == (64, 64)


def test_pixels_equal_the_processors_and_image_vectors_its_models(siglip2, engine):
    folder, model, processor = siglip2
    images = _images()
    processing, rows, grids = _prepared(folder, images)
    theirs_in = processor(images=images, return_tensors="pt")
    assert [tuple(g) for g in grids.tolist()] == [tuple(s) for s in theirs_in["spatial_shapes"].tolist()]
    assert (
        len({h * w for h, w in grids.tolist()}) > 2 and grids.max() > 4
    )  # grids of many sizes, past the 4 x 4 positions
    at = 0
    for i, (h, w) in enumerate(grids.tolist()):  # pixels: equal bit for bit, image by image (the padding left out)
        ours_px = processing.pixel_values(rows[at : at + h * w])
        assert np.array_equal(ours_px, theirs_in["pixel_values"][i, : h * w].numpy())
        at += h * w
    cu = np.concatenate([[0], np.cumsum(grids[:, 0] * grids[:, 1])]).astype(np.int32)
    engine.check_pages(np.zeros(0, np.int32), cu, rows, grids)
    ours = engine.step_patches((rows, grids)).result()
    with torch.inference_mode():
        theirs = model.get_image_features(**theirs_in).pooler_output.numpy()
    assert ours.shape == (len(SIZES), 48)
    assert _cosines(ours, theirs).min() >= COSINE, _cosines(ours, theirs)
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)
    # one image alone gives its vector in the batch: nothing leaks between images
    alone = engine.step_patches((rows[cu[3] : cu[4]], grids[3:4])).result()
    np.testing.assert_allclose(alone[0], ours[3], atol=1e-5, rtol=1e-5)


def test_text_vectors_equal_get_text_features(siglip2, engine):
    _, model, _ = siglip2
    encoder = TextEncoder(engine.info)
    ids = encoder.encode(encoder.with_prompt(["a photo of a cat", "two dogs in the snow", "x"], EmbedOptions()))
    (chunk,) = pack_chunks(ids, 1 << 20, 1024)
    ours = engine.embed(chunk.input_ids, chunk.cu_seqlens)
    with torch.inference_mode():
        theirs = model.get_text_features(input_ids=torch.tensor(np.array(ids, dtype=np.int64))).pooler_output.numpy()
    assert _cosines(ours, theirs).min() >= COSINE, _cosines(ours, theirs)


@pytest.mark.parametrize(
    ("forge", "message"),
    [
        (lambda rows, grids, cu, ids: (rows[:, :-1], grids, cu, ids), "-byte patches"),
        (lambda rows, grids, cu, ids: (rows[:-1], grids, cu, ids), "patch rows for images of"),
        (lambda rows, grids, cu, ids: (rows, grids, cu, np.array([5], np.int32)), "token ids beside it"),
        (
            lambda rows, grids, cu, ids: (rows, np.array([[5, 5]], np.int32), np.array([0, 25], np.int32), ids),
            "at most 24",
        ),
        (lambda rows, grids, cu, ids: (rows, grids, np.array([0, 3], np.int32), ids), "counted as 3 tokens"),
        (lambda rows, grids, cu, ids: (rows, grids[:0], cu, ids), "without its grid"),
    ],
)
def test_forged_patch_rows_are_refused(siglip2, engine, forge, message):
    _, rows, grids = _prepared(siglip2[0], _images()[:1])
    cu = np.array([0, int(grids[0, 0] * grids[0, 1])], np.int32)
    rows, grids, cu, ids = forge(rows, grids, cu, np.zeros(0, np.int32))
    with pytest.raises(InvalidTokens, match=message):
        engine.check_pages(ids, cu, rows, grids)


def test_text_rows_pass_and_a_fixed_model_takes_no_patch_rows(siglip2, engine, tmp_path):
    engine.check_pages(np.array([1, 2], np.int32), np.array([0, 2], np.int32), None, None)  # texts: nothing to check
    assert engine.image_path is None and engine.patch_path is not None
