"""SigLIP 2 NaFlex through the whole stack on real processes (a nats-server, a tokenizer, a worker, a
gateway) against transformers' Siglip2Model and Siglip2ImageProcessor on the same files: images of many
aspects, each resized to its own grid of patches by the tokenizer fleet and sent as patch rows, beside
texts in one request (Jina's items, Cohere's v2 images); usage counting each image's patches; hostile
files a 400 with the stack serving on; a reindex of a folder of images equal to the online vectors, a
truncated file a dead letter naming it."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.nats.server import EmbeddedNats, free_port
from embedfleet.shared.protocol import EmbedOptions
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.image_files import data_uri, encoded, huge_png_header, noise_files, write_files
from tests.support.image_models import build_siglip2
from tests.support.procs import Service, cli, running

pytestmark = pytest.mark.integration

MODEL = "siglip2"
SIDES = (8, 300)  # pixels a side: grids from 1 x 24 to 4 x 6 patches, and images scaled up and down


@dataclass
class Fleet:
    nats: EmbeddedNats
    model: Path
    base: str
    folder: Path
    services: dict[str, Service] = field(default_factory=dict)

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{s.log()[-2500:]}" for n, s in self.services.items())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[Fleet]:
    folder = tmp_path_factory.mktemp("naflex")
    model = build_siglip2(tmp_path_factory.mktemp("siglip2-build"))
    port = free_port()
    with EmbeddedNats(folder / "nats") as server:
        built = Fleet(server, model, f"http://127.0.0.1:{port}", folder)
        common = ["--nats", server.url, "--model", str(model), "--model-name", MODEL]
        built.services["gateway"] = Service(
            "gateway", ["--nats", server.url, "--port", str(port), "--default-model", MODEL], folder
        )
        built.services["tokenizer"] = Service("tokenizer", [*common, "--chunk-seqs", "3"], folder)
        built.services["worker"] = Service("worker", [*common, "--max-batch-tokens", "64"], folder)
        with running(built.services, server.url, built.base, timeout=120):
            yield built


@pytest.fixture(scope="module")
def reference(fleet):
    from transformers import Siglip2ImageProcessor, Siglip2Model

    model = Siglip2Model.from_pretrained(str(fleet.model)).eval()
    return model, Siglip2ImageProcessor.from_pretrained(str(fleet.model))


def _image_vectors(reference, images: list[Image.Image]) -> np.ndarray:
    model, processor = reference
    with torch.inference_mode():
        return model.get_image_features(**processor(images=images, return_tensors="pt")).pooler_output.numpy()


def _pictures() -> list[Image.Image]:
    rng = np.random.default_rng(3)
    sizes = [(32, 32), (300, 10), (9, 120), (200, 150), (41, 33)]
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


def _post(fleet: Fleet, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{fleet.base}{path}", json=body, timeout=60)


def test_images_of_many_aspects_and_texts_embed_as_transformers_does(fleet, reference):
    pictures = _pictures()
    gray = Image.fromarray(np.random.default_rng(4).integers(0, 256, (30, 50), dtype=np.uint8), "L")
    items = [{"image": data_uri(encoded(p))} for p in pictures[:3]]
    items += [{"text": "a photo of a cat"}, {"image": data_uri(encoded(pictures[3], "JPEG"), "image/jpeg")}]
    items += [{"image": data_uri(encoded(pictures[4]))}, {"image": data_uri(encoded(gray))}]
    reply = _post(fleet, "/v1/embeddings", {"model": MODEL, "input": items})
    assert reply.status_code == 200, reply.text + fleet.logs()
    ours = np.array([d["embedding"] for d in reply.json()["data"]], dtype=np.float32)
    jpeg = Image.open(io.BytesIO(encoded(pictures[3], "JPEG"))).convert("RGB")  # the JPEG as decoded
    images = [*pictures[:3], jpeg, pictures[4], gray.convert("RGB")]
    theirs = _image_vectors(
        reference, images
    )  # transformers takes a grayscale image converted (the tokenizer converts it)
    assert cosines(ours[[0, 1, 2, 4, 5, 6]], theirs).min() >= COSINE_TOLERANCE
    info = load_model_info(str(fleet.model))
    encoder = TextEncoder(info)
    ids = encoder.encode(encoder.with_prompt(["a photo of a cat"], EmbedOptions()))
    with torch.inference_mode():
        text = reference[0].get_text_features(input_ids=torch.tensor(ids)).pooler_output.numpy()
    assert cosines(ours[[3]], text).min() >= COSINE_TOLERANCE
    _, processor = reference
    shapes = processor(images=images, return_tensors="np")["spatial_shapes"]
    assert len({tuple(s) for s in shapes.tolist()}) >= 4  # grids of their own
    assert reply.json()["usage"]["prompt_tokens"] == 64 + int((shapes[:, 0] * shapes[:, 1]).sum())


def test_cohere_images_and_models_listing(fleet, reference):
    pictures = _pictures()[:2]
    body = {"model": MODEL, "input_type": "image", "embedding_types": ["float"]}
    body["images"] = [data_uri(encoded(p)) for p in pictures]
    reply = _post(fleet, "/v2/embed", body)
    assert reply.status_code == 200, reply.text
    ours = np.array(reply.json()["embeddings"]["float"], dtype=np.float32)
    assert cosines(ours, _image_vectors(reference, pictures)).min() >= COSINE_TOLERANCE
    models = httpx.get(f"{fleet.base}/v1/models", timeout=10).json()["data"]
    (entry,) = [m for m in models if m["id"] == MODEL]
    assert entry["inputs"] == ["text", "image"]


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        (data_uri(huge_png_header(50_000, 50_000)), "pixels"),
        (data_uri(b"GIF89a not really"), "image"),
        (data_uri(encoded(Image.new("RGB", (40, 40)))[:60]), "image"),
    ],
    ids=["50000x50000-header", "not-a-gif", "truncated-png"],
)
def test_hostile_images_a_400_and_the_stack_serves_on(fleet, reference, uri, says):
    reply = _post(fleet, "/v1/embeddings", {"model": MODEL, "input": [{"image": uri}]})
    assert reply.status_code == 400 and says in reply.json()["error"]["message"], reply.text
    picture = _pictures()[1]
    again = _post(fleet, "/v1/embeddings", {"model": MODEL, "input": [{"image": data_uri(encoded(picture))}]})
    assert again.status_code == 200, again.text
    assert cosines(np.array([again.json()["data"][0]["embedding"]]), _image_vectors(reference, [picture])).min() >= (
        COSINE_TOLERANCE
    )


def test_reindex_a_folder_lands_the_online_vectors_and_a_truncated_file_is_a_dead_letter(fleet, tmp_path):
    files = noise_files(10, seed=5, sides=SIDES)
    files[7] = (files[7][0], files[7][1][: len(files[7][1]) // 3])  # truncated
    paths = write_files(tmp_path / "pictures", files, [f"pic{i:02d}" for i in range(10)])
    out = tmp_path / "vectors.npy"
    args = ["reindex", str(tmp_path / "pictures"), "--nats", fleet.nats.url, "--model", MODEL]
    done = cli([*args, "--out", str(out), "--batch-size", "4", "--stall-timeout", "60", "--quiet"], timeout=180)
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "9 of 10 documents" in said and "1 given up" in said, said + fleet.logs()
    assert "document 'pic07.png': the PNG image cannot be decoded" in said, said
    ids = json.loads(out.with_suffix(".ids.json").read_text())
    assert ids == [p.name for i, p in enumerate(paths) if i != 7]
    online = _post(
        fleet,
        "/v1/embeddings",
        {"model": MODEL, "input": [{"image": data_uri(files[i][1])} for i in range(10) if i != 7]},
    )
    assert online.status_code == 200, online.text
    stored = np.load(out)
    assert cosines(stored, np.array([d["embedding"] for d in online.json()["data"]], np.float32)).min() >= (
        COSINE_TOLERANCE
    )
