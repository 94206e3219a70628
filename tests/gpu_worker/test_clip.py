"""CLIP through the engine against transformers' CLIPModel on the same inputs: the text tower (packed
rows of several lengths, pooled at the end-of-text token, projected) and the image tower (the folder's
image processor's pixels, normalised on the worker's side), cosine >= 0.9999 in fp32."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.tokenizer.encoder import TextEncoder, pack_chunks
from embedfleet.shared.images.preprocess import ImageProcessing
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.protocol import EmbedOptions
from tests.support.image_models import PROJECTION, build_clip

TEXTS = ["a photo of a cat", "two dogs playing in the snow on a bright winter morning", "x", "red " * 30]
COSINE = 0.9999


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    from transformers import CLIPImageProcessor, CLIPModel

    folder = build_clip(tmp_path_factory.mktemp("clip"), shortest_edge=40)
    return folder, CLIPModel.from_pretrained(str(folder)).eval(), CLIPImageProcessor.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def engine(clip):
    return Engine(load_model_info(str(clip[0])), "cpu")


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    sizes = [(32, 32), (64, 40), (17, 90), (300, 200)]
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


def test_a_clip_folder_reads_as_two_towers(clip):
    info = load_model_info(str(clip[0]))
    assert (info.inputs, info.dim, info.pooling, info.normalize) == (("text", "image"), PROJECTION, "lasttoken", False)
    assert info.max_seq_length == 77


def test_text_vectors_equal_get_text_features(clip, engine):
    _, model, _ = clip
    encoder = TextEncoder(engine.info)
    ids = encoder.encode(encoder.with_prompt(TEXTS, EmbedOptions()))
    (chunk,) = pack_chunks(ids, 1 << 20, 1024)
    ours = engine.embed(chunk.input_ids, chunk.cu_seqlens)
    rows = [chunk.input_ids[a:b] for a, b in zip(chunk.cu_seqlens[:-1], chunk.cu_seqlens[1:])]
    assert len({len(r) for r in rows}) == len(TEXTS)  # several lengths in the one packed batch
    width = max(len(r) for r in rows)
    padded = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        padded[i, : len(r)], mask[i, : len(r)] = torch.from_numpy(r.astype(np.int64)), 1
    with torch.inference_mode():
        theirs = model.get_text_features(input_ids=padded, attention_mask=mask).pooler_output.numpy()
    assert ours.shape == (len(TEXTS), PROJECTION)
    assert _cosines(ours, theirs).min() >= COSINE, _cosines(ours, theirs)
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)  # projected, not normalised: same scale


def test_image_vectors_equal_get_image_features(clip, engine):
    _, model, processor = clip
    images = _images()
    processing = ImageProcessing.from_folder(clip[0])
    pixels = np.stack([processing.pixels(image) for image in images])  # [N, 3, 32, 32] uint8
    ours = engine.step_images(pixels).result()
    with torch.inference_mode():
        reference = processor(images=images, return_tensors="pt")["pixel_values"]
        theirs = model.get_image_features(pixel_values=reference).pooler_output.numpy()
    assert ours.shape == (len(images), PROJECTION)
    assert _cosines(ours, theirs).min() >= COSINE, _cosines(ours, theirs)
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)


def test_text_and_image_vectors_share_one_space(clip, engine):
    """The towers' vectors have one width and the model's own similarities: the text-image cosine
    matrix equals transformers' logits_per_text / logit_scale."""
    _, model, processor = clip
    images = _images()
    encoder = TextEncoder(engine.info)
    ids = encoder.encode(encoder.with_prompt(TEXTS, EmbedOptions()))
    (chunk,) = pack_chunks(ids, 1 << 20, 1024)
    texts = engine.embed(chunk.input_ids, chunk.cu_seqlens)
    processing = ImageProcessing.from_folder(clip[0])
    pictures = engine.step_images(np.stack([processing.pixels(image) for image in images])).result()
    ours = (texts / np.linalg.norm(texts, axis=1, keepdims=True)) @ (
        pictures / np.linalg.norm(pictures, axis=1, keepdims=True)
    ).T
    batch = processor(images=images, return_tensors="pt")
    tokens = [
        torch.from_numpy(chunk.input_ids[a:b].astype(np.int64))
        for a, b in zip(chunk.cu_seqlens[:-1], chunk.cu_seqlens[1:])
    ]
    width = max(len(t) for t in tokens)
    padded = torch.stack([torch.nn.functional.pad(t, (0, width - len(t))) for t in tokens])
    mask = torch.stack([torch.nn.functional.pad(torch.ones_like(t), (0, width - len(t))) for t in tokens])
    with torch.inference_mode():
        out = model(input_ids=padded, attention_mask=mask, pixel_values=batch["pixel_values"])
        theirs = (out.logits_per_text / model.logit_scale.exp()).numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_a_text_model_takes_no_images(tmp_path):
    info = load_model_info(None)
    engine = Engine(info, "cpu")
    assert info.inputs == ("text",) and engine.image_path is None
    with pytest.raises(ValueError, match="takes no images"):
        engine.step_images(np.zeros((1, 3, 32, 32), dtype=np.uint8))


def test_images_of_another_shape_or_count_are_refused(engine):
    from embedfleet.services.gpu_worker.engine.errors import InvalidTokens

    tokens = engine.image_tokens
    assert tokens == (32 // 8) ** 2 + 1  # 16 patches and the class token
    engine.check_images(np.zeros((2, 3, 32, 32), np.uint8), np.array([0, tokens, 2 * tokens]))
    with pytest.raises(InvalidTokens, match=r"shape \[3, 64, 64\]; .* takes \[3, 32, 32\]"):
        engine.check_images(np.zeros((1, 3, 64, 64), np.uint8), np.array([0, tokens]))
    with pytest.raises(InvalidTokens, match="other than its tower's 17 tokens"):
        engine.check_images(np.zeros((1, 3, 32, 32), np.uint8), np.array([0, 5]))
    info = load_model_info(None)
    with pytest.raises(InvalidTokens, match="embeds texts only"):
        Engine(info, "cpu").check_images(np.zeros((1, 3, 32, 32), np.uint8), np.array([0, 17]))


def test_image_batches_replay_from_graphs_bucketed_by_image_count(clip, engine):
    """The graph bookkeeping on CPU (the one CUDA-only call, the capture, replaced by an eager replay of
    the static forward): batches of n images run in the smallest image-count bucket >= n, captured once
    each, and give the eager path's vectors; a batch past the largest bucket runs eagerly."""
    from embedfleet.services.gpu_worker.engine.images import image_buckets

    assert image_buckets(1) == [1] and image_buckets(6) == [1, 2, 4, 6] and image_buckets(8) == [1, 2, 4, 8]
    graphed = Engine(
        engine.info,
        "cpu",
        graphs=True,
        max_batch_tokens=6 * engine.image_tokens,
        capture=lambda eng, bucket: lambda: eng._static_forward(bucket),
        model=engine.model,
    )
    assert graphed.image_path is not None and graphed.image_path.graphs is not None
    assert graphed.image_path.graphs.buckets == [1, 2, 4, 6]
    rng = np.random.default_rng(3)
    runs = []
    for n in (3, 1, 3, 4, 2, 5, 3):
        pixels = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
        handle = graphed.step_images(pixels)
        runs.append(handle.run)
        np.testing.assert_allclose(handle.result(), engine.step_images(pixels).result(), atol=1e-5)
    assert runs == ["captured", "captured", "replay", "replay", "captured", "captured", "replay"]
    big = graphed.step_images(rng.integers(0, 256, (7, 3, 32, 32), dtype=np.uint8))
    assert big.run == "eager" and big.result().shape == (7, 24)
