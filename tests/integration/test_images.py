"""Images through the whole stack — HTTP, NATS, tokenizer (decoding and preparing them), worker (the
image tower) as processes — against transformers' CLIPModel and its image processor on the same files:
/v1/embeddings with {'image': data URI} items, alone and mixed with texts; hostile images refused with a
clear 400 and no process harmed."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.image_models import PROJECTION, build_clip
from tests.support.procs import running_fleet

pytestmark = pytest.mark.integration

PREFIX = "images"
MODEL = "clip"


@pytest.fixture(scope="module")
def fleet(nats_url: str, tmp_path_factory) -> Iterator[tuple[str, object]]:
    folder = build_clip(tmp_path_factory.mktemp("clip-build"), shortest_edge=40)
    with running_fleet(nats_url, PREFIX, {MODEL: folder}, tmp_path_factory.mktemp("image-logs")) as (url, _):
        yield url, folder


@pytest.fixture(scope="module")
def reference(fleet):
    from transformers import CLIPImageProcessor, CLIPModel

    folder = fleet[1]
    return CLIPModel.from_pretrained(str(folder)).eval(), CLIPImageProcessor.from_pretrained(str(folder))


def _png(image: Image.Image, kind: str = "PNG") -> bytes:
    out = io.BytesIO()
    image.save(out, kind)
    return out.getvalue()


def _uri(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def _pictures() -> list[Image.Image]:
    rng = np.random.default_rng(1)
    return [
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in [(32, 32), (90, 41), (200, 300)]
    ] + [Image.fromarray(rng.integers(0, 256, (50, 60, 4), dtype=np.uint8), "RGBA")]


def _post(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/embeddings", json=body, timeout=60)


def _image_reference(reference, images: list[Image.Image]) -> np.ndarray:
    model, processor = reference
    with torch.inference_mode():
        pixels = processor(images=images, return_tensors="pt")["pixel_values"]
        return model.get_image_features(pixel_values=pixels).pooler_output.numpy()


def test_images_embed_as_transformers_does(fleet, reference):
    url, _ = fleet
    pictures = _pictures()
    reply = _post(url, {"model": MODEL, "input": [{"image": _uri(_png(p))} for p in pictures]})
    assert reply.status_code == 200, reply.text
    ours = np.array([d["embedding"] for d in reply.json()["data"]], dtype=np.float32)
    assert ours.shape == (len(pictures), PROJECTION)
    # the files decoded as the processor reads them: an RGBA PNG decodes to RGBA in both
    theirs = _image_reference(reference, [Image.open(io.BytesIO(_png(p))) for p in pictures])
    assert cosines(ours, theirs).min() >= COSINE_TOLERANCE, cosines(ours, theirs)


def test_a_jpeg_and_a_webp_embed_as_decoded(fleet, reference):
    url, _ = fleet
    picture = _pictures()[2]
    files = [(_png(picture, "JPEG"), "image/jpeg"), (_png(picture, "WEBP"), "image/webp")]
    reply = _post(url, {"model": MODEL, "input": [{"image": _uri(data, media)} for data, media in files]})
    assert reply.status_code == 200, reply.text
    ours = np.array([d["embedding"] for d in reply.json()["data"]], dtype=np.float32)
    theirs = _image_reference(reference, [Image.open(io.BytesIO(data)) for data, _ in files])
    assert cosines(ours, theirs).min() >= COSINE_TOLERANCE, cosines(ours, theirs)


def test_texts_and_images_mixed_answer_in_input_order(fleet, reference):
    """Jina's form: {'text': ...} and {'image': ...} items in one request, each through its tower,
    the rows in the order given; the texts' vectors as the text-only request gives them."""
    url, _ = fleet
    pictures = _pictures()[:2]
    items = [
        {"text": "a red square"},
        {"image": _uri(_png(pictures[0]))},
        {"text": "noise"},
        {"image": _uri(_png(pictures[1]))},
    ]
    reply = _post(url, {"model": MODEL, "input": items})
    assert reply.status_code == 200, reply.text
    rows = reply.json()["data"]
    assert [d["index"] for d in rows] == [0, 1, 2, 3]
    ours = np.array([d["embedding"] for d in rows], dtype=np.float32)
    texts = _post(url, {"model": MODEL, "input": ["a red square", "noise"]}).json()["data"]
    np.testing.assert_allclose(ours[[0, 2]], np.array([d["embedding"] for d in texts]), atol=1e-6)
    theirs = _image_reference(reference, pictures)
    assert cosines(ours[[1, 3]], theirs).min() >= COSINE_TOLERANCE


def _huge_png_header(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("https://example.com/cat.png", "data URI"),
        ("data:image/png;base64,!!!notbase64", "base64"),
        (_uri(b"plain text, not an image"), "not a PNG, JPEG, WebP or GIF"),
        (_uri(_huge_png_header(50_000, 50_000)), "50000x50000"),
        (_uri(_png(Image.new("RGB", (40, 40)))[:60]), "truncated"),
    ],
    ids=["a-url", "not-base64", "not-an-image", "a-bomb-header", "truncated"],
)
def test_hostile_images_get_a_clear_400_and_the_stack_serves_on(fleet, uri, says):
    url, _ = fleet
    reply = _post(url, {"model": MODEL, "input": [{"text": "fine"}, {"image": uri}]})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert "input[1]" in error["message"] or "input 1" in error["message"], error
    assert says in error["message"], error
    assert _post(url, {"model": MODEL, "input": [{"image": _uri(_png(_pictures()[0]))}]}).status_code == 200


def test_an_item_with_both_or_neither_is_refused(fleet):
    url, _ = fleet
    for item in ({"text": "a", "image": _uri(_png(_pictures()[0]))}, {}):
        reply = _post(url, {"model": MODEL, "input": [item]})
        assert reply.status_code == 400, reply.text
        assert "exactly one of 'text' and 'image'" in reply.json()["error"]["message"]


def test_models_lists_what_each_model_embeds(fleet):
    url, _ = fleet
    cards = {m["id"]: m for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}
    assert cards[MODEL]["inputs"] == ["text", "image"], cards[MODEL]
