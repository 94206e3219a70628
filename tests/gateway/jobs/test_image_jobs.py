"""POST /v1/jobs with image documents, JobsApi over a real nats-server: batches cut by bytes so that every
job batch fits the server's message limit, each image in its batch as sent; and what is refused before
anything is published (no record, nothing in the jobs stream): a model that embeds texts only, an image
no batch can carry (413), an image past the gateway's --max-image-bytes / --max-image-pixels by its
header, texts among images, with_text, chunking, sparse vectors."""

from __future__ import annotations

import asyncio
import uuid

import nats
import numpy as np
import orjson
import pytest
from PIL import Image

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.jobs.api import JobsApi, parse_job
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.images.decode import ImageLimits
from embedfleet.shared.jobs.bucket import read_state
from embedfleet.shared.jobs.streams import ensure_streams, stream_names
from embedfleet.shared.nats.fleet import FleetView
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import JobBatch, decode_as
from tests.support.image_files import data_uri, encoded, huge_png_header, noise

CLIP = {"max_seq_length": "77"}, {"dim": "24", "outputs": "dense", "inputs": "text,image"}
MINI = {"max_seq_length": "256"}, {"dim": "384", "outputs": "dense,sparse", "inputs": "text"}
FLEET = FleetView({"clip": CLIP[0], "mini": MINI[0]}, {"clip": CLIP[1], "mini": MINI[1]}, 0.0)
PAYLOAD = 64 << 10  # the server's message limit the jobs are cut for: room for 48 KiB of images a batch


def _images(sizes: list[int], seed: int = 0) -> list[bytes]:
    """PNG files of noise (~3 bytes a pixel), ``sizes`` pixels a side."""
    rng = np.random.default_rng(seed)
    return [encoded(noise(side, side, rng)) for side in sizes]


def _png(width: int, height: int) -> bytes:
    return encoded(noise(width, height, np.random.default_rng(width)))


def _body(job: str, files: list[bytes], **fields) -> bytes:
    docs = [{"id": f"d{i}", "image": data_uri(f)} for i, f in enumerate(files)]
    return orjson.dumps({"id": job, "model": "clip", "documents": docs, **fields})


async def _api(nc, **kwargs) -> tuple[JobsApi, object, object, Subjects]:
    js, subjects = nc.jetstream(), Subjects(f"t{uuid.uuid4().hex[:8]}")
    kv = await ensure_streams(js, subjects)
    return JobsApi(js, kv, subjects, None, **kwargs), js, kv, subjects


async def _published(js, subjects: Subjects) -> list:
    """The jobs stream's messages, in order (read by sequence: the stream is a work queue)."""
    stream = stream_names(subjects)["jobs"]
    info = await js.stream_info(stream)
    return [await js.get_msg(stream, seq) for seq in range(info.state.first_seq, info.state.last_seq + 1)]


def test_a_job_of_images_is_cut_by_bytes_into_batches_that_each_fit_a_message(nats_url):
    files = _images([60] * 9 + [110] + [40] * 4)  # ~11 KB each, one of ~36 KB, four of ~5 KB

    async def main() -> None:
        nc = await nats.connect(nats_url)
        try:
            api, js, kv, subjects = await _api(nc)
            status, answer = await api.create(parse_job(_body("cut", files)), "clip", FLEET, PAYLOAD)
            assert (status, answer["documents"], answer["batch_size"]) == (202, len(files), 64)
            messages = await _published(js, subjects)
            batches = [decode_as(m.data, JobBatch) for m in messages]
            assert all(len(m.data) + sum(len(k) + len(v) for k, v in m.headers.items()) < PAYLOAD for m in messages)
            assert [b.batch for b in batches] == list(range(len(batches))) and len(batches) >= 4
            assert [i for b in batches for i in b.images] == files and all(b.texts == [] for b in batches)
            assert [d for b in batches for d in b.doc_ids] == [f"d{i}" for i in range(len(files))]
            assert all(sum(map(len, b.images)) <= PAYLOAD - (16 << 10) for b in batches)
            state = await read_state(kv, "cut")
            assert state is not None and state.batches == len(batches) == state.published
        finally:
            await nc.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("files", "fields", "code", "param", "says"),
    [
        (
            _images([30]),
            {"model": "mini"},
            ErrorCode.INVALID_REQUEST,
            "model",
            "mini embeds text only: it takes no image documents (a two-tower model, CLIP or SigLIP, embeds images)",
        ),
        (
            _images([30, 150]),
            {},
            ErrorCode.PAYLOAD_TOO_LARGE,
            "documents",
            "document 'd1': its image is",
        ),
        ([_png(30, 30), huge_png_header(50_000, 50_000)], {}, ErrorCode.INVALID_REQUEST, "documents.image", "'documents[1].image' (document 'd1'): the image is 50000x50000"),
        (_images([30]), {"with_text": True, "sink": "lancedb:///s?table=t"}, ErrorCode.INVALID_REQUEST, "with_text", "'with_text' stores texts"),
        (_images([30]), {"chunking": {"size": 8}}, ErrorCode.INVALID_REQUEST, "chunking", "chunking applies to texts"),
        (_images([30]), {"output": "sparse"}, ErrorCode.INVALID_REQUEST, "output", "images make dense vectors only"),
    ],
    ids=["text-model", "too-large-for-a-batch", "bomb-header", "with-text", "chunking", "sparse"],
)  # fmt: skip
def test_what_a_job_of_images_cannot_do_is_refused_before_anything_is_published(
    nats_url, files, fields, code, param, says
):
    async def main() -> None:
        nc = await nats.connect(nats_url)
        try:
            api, js, kv, subjects = await _api(nc)
            body = orjson.loads(_body("refused", files))
            with pytest.raises(ApiError) as caught:
                await api.create(parse_job(orjson.dumps(body | fields)), fields.get("model", "clip"), FLEET, PAYLOAD)
            error = caught.value
            assert (error.code, error.param) == (code, param) and says in error.message, error.message
            assert await read_state(kv, "refused") is None
            assert (await js.stream_info(stream_names(subjects)["jobs"])).state.messages == 0
        finally:
            await nc.close()

    asyncio.run(main())


def test_the_gateways_image_limits_hold_a_jobs_images(nats_url):
    """--max-image-bytes and --max-image-pixels, by the header, before anything is published; within
    them the job is taken."""
    small, wide = _png(30, 30), encoded(Image.new("RGB", (60, 50)))  # wide: a small file of 3,000 pixels

    async def main() -> None:
        nc = await nats.connect(nats_url)
        try:
            api, js, _, subjects = await _api(nc, image_limits=ImageLimits(max_bytes=len(small), max_pixels=2500))
            for bad, says in (
                (wide, "over the limit of 2500 pixels"),
                (small + b"\0", f"over the limit of {len(small)} bytes"),
            ):
                with pytest.raises(ApiError) as caught:
                    await api.create(parse_job(_body("limited", [small, bad])), "clip", FLEET, PAYLOAD)
                assert "'documents[1].image' (document 'd1')" in caught.value.message, caught.value.message
                assert says in caught.value.message, caught.value.message
            assert (await js.stream_info(stream_names(subjects)["jobs"])).state.messages == 0
            status, _ = await api.create(parse_job(_body("limited", [small])), "clip", FLEET, PAYLOAD)
            assert status == 202 and (await js.stream_info(stream_names(subjects)["jobs"])).state.messages == 1
        finally:
            await nc.close()

    asyncio.run(main())
