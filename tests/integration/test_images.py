"""Images through the whole stack — HTTP, NATS, tokenizer (decoding and preparing them), worker (the
image tower) as processes — against transformers' CLIPModel and its image processor on the same files:
/v1/embeddings with {'image': data URI} items, alone and mixed with texts; hostile images refused with a
clear 400 and no process harmed."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.shared.model_dir.folder import default_model_path
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.protocol import EmbedOptions
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.image_files import clip_image_vectors, clip_reference, data_uri, encoded, huge_png_header
from tests.support.image_models import PROJECTION, build_clip, build_siglip, package_clip
from tests.support.procs import running_fleet

pytestmark = pytest.mark.integration

PREFIX = "images"
MODEL = "clip"
TEXT_MODEL = "mini"  # the default model: texts only
SIGLIP = "siglip"
# the same CLIP in the sentence-transformers packaging: as published (sentence-transformers/clip-ViT-B-32's
# 0_CLIPModel folder) and as sentence-transformers saves it now
PACKAGINGS = ("published", "saved")


@pytest.fixture(scope="module")
def fleet(nats_url: str, tmp_path_factory) -> Iterator[tuple[str, Path, Path, Path]]:
    folder = build_clip(tmp_path_factory.mktemp("clip-build"), shortest_edge=40)
    siglip = build_siglip(tmp_path_factory.mktemp("siglip-build"))
    packaged = tmp_path_factory.mktemp("clip-packaged")
    models = {MODEL: folder, TEXT_MODEL: default_model_path(), SIGLIP: siglip}
    models |= {f"{MODEL}-{layout}": package_clip(folder, packaged, layout) for layout in PACKAGINGS}
    with running_fleet(nats_url, PREFIX, models, tmp_path_factory.mktemp("image-logs"), named=True) as (url, _):
        yield url, folder, siglip, packaged


@pytest.fixture(scope="module")
def reference(fleet):
    return clip_reference(fleet[1])


def _pictures() -> list[Image.Image]:
    rng = np.random.default_rng(1)
    return [
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in [(32, 32), (90, 41), (200, 300)]
    ] + [Image.fromarray(rng.integers(0, 256, (50, 60, 4), dtype=np.uint8), "RGBA")]


def _post(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/embeddings", json=body, timeout=60)


def test_images_embed_as_transformers_does(fleet, reference):
    url = fleet[0]
    pictures = _pictures()
    reply = _post(url, {"model": MODEL, "input": [{"image": data_uri(encoded(p))} for p in pictures]})
    assert reply.status_code == 200, reply.text
    ours = np.array([d["embedding"] for d in reply.json()["data"]], dtype=np.float32)
    assert ours.shape == (len(pictures), PROJECTION)
    # the files decoded as the processor reads them: an RGBA PNG decodes to RGBA in both
    theirs = clip_image_vectors(reference, [Image.open(io.BytesIO(encoded(p))) for p in pictures])
    assert cosines(ours, theirs).min() >= COSINE_TOLERANCE, cosines(ours, theirs)


def test_a_jpeg_and_a_webp_embed_as_decoded(fleet, reference):
    url = fleet[0]
    picture = _pictures()[2]
    files = [(encoded(picture, "JPEG"), "image/jpeg"), (encoded(picture, "WEBP"), "image/webp")]
    reply = _post(url, {"model": MODEL, "input": [{"image": data_uri(data, media)} for data, media in files]})
    assert reply.status_code == 200, reply.text
    ours = np.array([d["embedding"] for d in reply.json()["data"]], dtype=np.float32)
    theirs = clip_image_vectors(reference, [Image.open(io.BytesIO(data)) for data, _ in files])
    assert cosines(ours, theirs).min() >= COSINE_TOLERANCE, cosines(ours, theirs)


def test_texts_and_images_mixed_answer_in_input_order(fleet, reference):
    """Jina's form: {'text': ...} and {'image': ...} items in one request, each through its tower,
    the rows in the order given; the texts' vectors as the text-only request gives them."""
    url = fleet[0]
    pictures = _pictures()[:2]
    items = [
        {"text": "a red square"},
        {"image": data_uri(encoded(pictures[0]))},
        {"text": "noise"},
        {"image": data_uri(encoded(pictures[1]))},
    ]
    reply = _post(url, {"model": MODEL, "input": items})
    assert reply.status_code == 200, reply.text
    rows = reply.json()["data"]
    assert [d["index"] for d in rows] == [0, 1, 2, 3]
    ours = np.array([d["embedding"] for d in rows], dtype=np.float32)
    texts = _post(url, {"model": MODEL, "input": ["a red square", "noise"]}).json()["data"]
    np.testing.assert_allclose(ours[[0, 2]], np.array([d["embedding"] for d in texts]), atol=1e-6)
    theirs = clip_image_vectors(reference, pictures)
    assert cosines(ours[[1, 3]], theirs).min() >= COSINE_TOLERANCE


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("https://example.com/cat.png", "data URI"),
        ("data:image/png;base64,!!!notbase64", "base64"),
        (data_uri(b"plain text, not an image"), "not a PNG, JPEG, WebP or GIF"),
        (data_uri(huge_png_header(50_000, 50_000)), "50000x50000"),
        (data_uri(encoded(Image.new("RGB", (40, 40)))[:60]), "truncated"),
    ],
    ids=["a-url", "not-base64", "not-an-image", "a-bomb-header", "truncated"],
)
def test_hostile_images_get_a_clear_400_and_the_stack_serves_on(fleet, uri, says):
    url = fleet[0]
    reply = _post(url, {"model": MODEL, "input": [{"text": "fine"}, {"image": uri}]})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert "input[1]" in error["message"] or "input 1" in error["message"], error
    assert says in error["message"], error
    assert _post(url, {"model": MODEL, "input": [{"image": data_uri(encoded(_pictures()[0]))}]}).status_code == 200


def test_an_item_with_both_or_neither_is_refused(fleet):
    url = fleet[0]
    for item in ({"text": "a", "image": data_uri(encoded(_pictures()[0]))}, {}):
        reply = _post(url, {"model": MODEL, "input": [item]})
        assert reply.status_code == 400, reply.text
        assert "exactly one of 'text' and 'image'" in reply.json()["error"]["message"]


def test_models_lists_what_each_model_embeds(fleet):
    url = fleet[0]
    cards = {m["id"]: m for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}
    assert cards[MODEL]["inputs"] == ["text", "image"], cards[MODEL]
    assert cards[TEXT_MODEL]["inputs"] == ["text"], cards[TEXT_MODEL]


def test_cohere_sdk_embeds_images(fleet, reference):
    """Cohere's own SDK, unchanged: ``ClientV2.embed(images=..., input_type="image")``, and images as
    image_url content items of ``inputs`` beside a text item, in the order given."""
    import cohere

    url = fleet[0]
    client = cohere.ClientV2(api_key="unused", base_url=url, timeout=120)
    pictures = _pictures()[:3]
    uris = [data_uri(encoded(p)) for p in pictures]
    theirs = clip_image_vectors(reference, pictures)
    answer = client.embed(model=MODEL, images=uris, input_type="image", embedding_types=["float"])
    ours = np.array(answer.embeddings.float_, dtype=np.float32)
    assert cosines(ours, theirs).min() >= COSINE_TOLERANCE, cosines(ours, theirs)
    assert [(i.width, i.height, i.format, i.bit_depth) for i in answer.images] == [
        (32, 32, "png", 8),
        (90, 41, "png", 8),
        (200, 300, "png", 8),
    ]
    inputs = [
        {"content": [{"type": "image_url", "image_url": {"url": uris[0]}}]},
        {"content": [{"type": "text", "text": "a red square"}]},
        {"content": [{"type": "image_url", "image_url": {"url": uris[1]}}]},
    ]
    mixed = client.embed(model=MODEL, inputs=inputs, input_type="search_document", embedding_types=["float", "int8"])
    rows = np.array(mixed.embeddings.float_, dtype=np.float32)
    assert rows.shape == (3, PROJECTION) and len(mixed.embeddings.int8) == 3
    assert cosines(rows[[0, 2]], theirs[:2]).min() >= COSINE_TOLERANCE
    text = client.embed(model=MODEL, texts=["a red square"], input_type="search_document", embedding_types=["float"])
    np.testing.assert_allclose(rows[1], np.array(text.embeddings.float_[0]), atol=1e-6)


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"images": ["data:image/png;base64,AAAA"], "texts": ["a"]}, 400, "not both"),
        ({"images": ["https://example.com/cat.png"]}, 400, "'images[0]'"),
        ({"inputs": [{"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}, 400, "one item"),
        ({"inputs": [{"content": [{"type": "image_url", "image_url": {}}]}]}, 400, "one item"),
        ({"images": ["data:image/png;base64,AAAA"], "chunking": {"size": 8}}, 400, "chunking"),
    ],
    ids=["images-and-texts", "not-a-data-uri", "two-items", "no-url", "chunked-images"],
)
def test_cohere_image_requests_refused_in_cohere_shape(fleet, body, status, says):
    url = fleet[0]
    reply = httpx.post(f"{url}/v2/embed", json={"model": MODEL, "input_type": "image", **body}, timeout=30)
    assert reply.status_code == status, reply.text
    assert says in reply.json()["message"], reply.json()


def test_a_text_model_refuses_images_naming_why(fleet):
    """Images sent to a model that embeds texts only: 400 before anything reaches a worker."""
    url = fleet[0]
    reply = _post(url, {"model": TEXT_MODEL, "input": [{"image": data_uri(encoded(_pictures()[0]))}]})
    assert reply.status_code == 400, reply.text
    assert "embeds texts only" in reply.json()["error"]["message"]
    cohere = httpx.post(
        f"{url}/v2/embed", json={"model": TEXT_MODEL, "images": [data_uri(encoded(_pictures()[0]))]}, timeout=30
    )
    assert cohere.status_code == 400 and "embeds texts only" in cohere.json()["message"], cohere.text


def test_infinity_modality_image_on_its_route(fleet, reference):
    """infinity's form on its route (/embeddings): 'input' strings read as images with modality 'image'."""
    url = fleet[0]
    pictures = _pictures()[:2]
    body = {"model": MODEL, "input": [data_uri(encoded(p)) for p in pictures], "modality": "image"}
    reply = httpx.post(f"{url}/embeddings", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    ours = np.array([d["embedding"] for d in reply.json()["data"]], dtype=np.float32)
    assert cosines(ours, clip_image_vectors(reference, pictures)).min() >= COSINE_TOLERANCE
    one = httpx.post(f"{url}/embeddings", json={**body, "input": body["input"][0]}, timeout=60)
    assert one.status_code == 200 and len(one.json()["data"]) == 1, one.text
    tokens = httpx.post(f"{url}/embeddings", json={**body, "input": [1, 2]}, timeout=60)
    assert tokens.status_code == 400 and "data URIs" in tokens.json()["error"]["message"], tokens.text


def test_dimensions_forms_and_usage_apply_to_images(fleet):
    """Matryoshka dimensions and the vector forms apply to image rows as to text rows; usage counts an
    image as the tokens its tower runs (16 patches and the class token here)."""
    url = fleet[0]
    items = [{"image": data_uri(encoded(p))} for p in _pictures()[:2]]
    full = _post(url, {"model": MODEL, "input": items}).json()
    assert full["usage"]["prompt_tokens"] == 2 * 17, full["usage"]
    cut = _post(url, {"model": MODEL, "input": items, "dimensions": 8}).json()["data"]
    rows = np.array([d["embedding"] for d in full["data"]], dtype=np.float32)
    # cut, not renormalised: the model's vectors are not normalised (renormalised only where they are)
    np.testing.assert_allclose(np.array([d["embedding"] for d in cut]), rows[:, :8], atol=1e-6)
    signs = _post(url, {"model": MODEL, "input": items, "embedding_type": "binary"}).json()["data"]
    expected = np.packbits(rows > 0, axis=1).astype(np.int16) - 128
    np.testing.assert_array_equal(np.array([d["embedding"] for d in signs]), expected)


def test_siglip_texts_and_images_through_the_stack(fleet):
    """SigLIP served: its texts padded to 64 tokens by the tokenizer fleet (as its processor pads them),
    its images through the attention-pooling head; both as transformers makes them."""
    from transformers import SiglipImageProcessor, SiglipModel

    url, _, folder, _ = fleet
    model, processor = (
        SiglipModel.from_pretrained(str(folder)).eval(),
        SiglipImageProcessor.from_pretrained(str(folder)),
    )
    pictures = _pictures()[:2]
    items = [
        {"image": data_uri(encoded(pictures[0]))},
        {"text": "a photo of a cat"},
        {"image": data_uri(encoded(pictures[1]))},
    ]
    reply = _post(url, {"model": SIGLIP, "input": items})
    assert reply.status_code == 200, reply.text
    ours = np.array([d["embedding"] for d in reply.json()["data"]], dtype=np.float32)
    encoder = TextEncoder(load_model_info(str(folder)))
    ids = encoder.encode(encoder.with_prompt(["a photo of a cat"], EmbedOptions()))
    with torch.inference_mode():
        text = model.get_text_features(input_ids=torch.tensor(ids)).pooler_output.numpy()
        pixels = processor(images=pictures, return_tensors="pt")["pixel_values"]
        images = model.get_image_features(pixel_values=pixels).pooler_output.numpy()
    assert cosines(ours[[0, 2]], images).min() >= COSINE_TOLERANCE
    assert cosines(ours[[1]], text).min() >= COSINE_TOLERANCE
    assert reply.json()["usage"]["prompt_tokens"] == 64 + 2 * 16  # a padded text row, two images of 16 patches


def test_the_image_limits_hold_on_every_route_that_takes_images(fleet, nats_url, tmp_path):
    """A gateway with --max-image-bytes and --max-image-pixels: an image past either is refused 400 naming
    the input and the limit, on each route and form that takes images; one within them is embedded."""
    from embedfleet.shared.nats.server import free_port
    from tests.support.procs import Service, wait_until

    port = free_port()
    args = ["--nats", nats_url, "--subject-prefix", PREFIX, "--port", str(port)]
    gateway = Service("gateway", [*args, "--max-image-bytes", "5000", "--max-image-pixels", "2500"], tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(url), 60, "the limited gateway", [gateway])
        small = data_uri(encoded(_pictures()[0]))  # 32 x 32: 1,024 pixels, about 3 KB: within both
        wide = data_uri(encoded(Image.new("RGB", (60, 50))))  # 3,000 pixels, a small file
        heavy = data_uri(encoded(_pictures()[2]))  # 200 x 300 of noise: some 180 KB
        for uri, says in ((wide, "2500"), (heavy, "5000")):
            bodies = [
                ("/v1/embeddings", {"model": MODEL, "input": [{"text": "a"}, {"image": uri}]}, "input[1]"),
                ("/embeddings", {"model": MODEL, "input": ["data:,", uri][1:], "modality": "image"}, "input[0]"),
                ("/v2/embed", {"model": MODEL, "images": [small, uri], "input_type": "image"}, "images[1]"),
                (
                    "/v2/embed",
                    {"model": MODEL, "inputs": [{"content": [{"type": "image_url", "image_url": {"url": uri}}]}]},
                    "inputs[0]",
                ),
            ]
            for path, body, where in bodies:
                reply = httpx.post(f"{url}{path}", json=body, timeout=30)
                assert reply.status_code == 400, (path, reply.text)
                message = reply.json().get("message") or reply.json()["error"]["message"]
                assert where in message and says in message, (path, message)
        assert _post(url, {"model": MODEL, "input": [{"image": small}]}).status_code == 200
    finally:
        gateway.stop()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_tokenizer_refuses_an_image_past_its_limits_sent_around_the_gateway(fleet, nats_url):
    """A forged EmbedRequest straight to the tokenizers, its image's header declaring 50,000 x 50,000
    pixels: the tokenizer refuses it before decoding a pixel (its own --max-image-pixels), naming the row."""
    import asyncio
    import time

    import nats

    from embedfleet.shared.nats.subjects import Subjects
    from embedfleet.shared.protocol import EmbedRequest, ErrorReply, decode, encode

    async def ask() -> object:
        nc = await nats.connect(nats_url)
        try:
            request = EmbedRequest("forged", MODEL, [], time.time() + 30, images=[huge_png_header(50_000, 50_000)])
            reply = await nc.request(Subjects(PREFIX).embed(MODEL), encode(request), timeout=20)
            return decode(reply.data)
        finally:
            await nc.close()

    answer = asyncio.run(ask())
    assert isinstance(answer, ErrorReply) and answer.row == 0, answer
    assert "50000x50000" in answer.message and "40000000" in answer.message.replace(",", ""), answer.message


def _animated_gif() -> bytes:
    frames = [Image.new("RGB", (20, 20), color) for color in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    return out.getvalue()


def _cmyk_jpeg() -> bytes:
    out = io.BytesIO()
    data = np.random.default_rng(4).integers(0, 256, (40, 50, 4), dtype=np.uint8)
    Image.frombytes("CMYK", (50, 40), data.tobytes()).save(out, "JPEG")
    return out.getvalue()


def _png16() -> bytes:
    out = io.BytesIO()
    values = np.random.default_rng(5).integers(0, 65536, (30, 40), dtype=np.uint16)
    Image.fromarray(values).save(out, "PNG")  # mode I;16
    return out.getvalue()


def test_odd_images_are_converted_as_the_processor_does_or_refused(fleet, reference):
    """A CMYK JPEG and a 16-bit PNG embed as transformers' processor converts them; an animated GIF is
    refused 400 naming its input; every process stays up (the next request is answered)."""
    url = fleet[0]
    files = [(_cmyk_jpeg(), "image/jpeg"), (_png16(), "image/png")]
    reply = _post(url, {"model": MODEL, "input": [{"image": data_uri(data, media)} for data, media in files]})
    assert reply.status_code == 200, reply.text
    ours = np.array([d["embedding"] for d in reply.json()["data"]], dtype=np.float32)
    theirs = clip_image_vectors(reference, [Image.open(io.BytesIO(data)) for data, _ in files])
    assert cosines(ours, theirs).min() >= COSINE_TOLERANCE, cosines(ours, theirs)
    gif = _post(url, {"model": MODEL, "input": [{"text": "a"}, {"image": data_uri(_animated_gif(), "image/gif")}]})
    assert gif.status_code == 400 and "input 1" in gif.json()["error"]["message"], gif.text
    assert "animated" in gif.json()["error"]["message"], gif.text
    assert _post(url, {"model": MODEL, "input": [{"image": data_uri(encoded(_pictures()[0]))}]}).status_code == 200


@pytest.mark.parametrize("layout", PACKAGINGS)
def test_clip_in_the_sentence_transformers_packaging_embeds_as_sentence_transformers_does(fleet, layout):
    """A CLIP folder as sentence-transformers packages it serves under the packaging folder's name: its
    texts and images through the stack against SentenceTransformer(folder).encode of the same inputs."""
    from sentence_transformers import SentenceTransformer

    url, packaged = fleet[0], fleet[3] / layout
    model = SentenceTransformer(str(packaged), device="cpu")
    texts = ["a red square", "noise", "a photograph of a cat on a mat in the sun"]
    pictures = _pictures()
    files = [encoded(p) for p in pictures]
    reply = _post(
        url,
        {
            "model": f"{MODEL}-{layout}",
            "input": [*({"text": t} for t in texts), *({"image": data_uri(f)} for f in files)],
        },
    )
    assert reply.status_code == 200, reply.text
    ours = np.array([d["embedding"] for d in reply.json()["data"]], dtype=np.float32)
    theirs = np.concatenate([model.encode(texts), model.encode([Image.open(io.BytesIO(f)) for f in files])]).astype(
        np.float32
    )
    assert ours.shape == theirs.shape == (len(texts) + len(files), PROJECTION)
    assert cosines(ours, theirs).min() >= COSINE_TOLERANCE, cosines(ours, theirs)
