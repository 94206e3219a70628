"""Images on the wire: an EmbedRequest's files and a TokenChunk's prepared pixels round-trip, and a
forged message is refused before its pixels are copied (shape against bytes, rows, channels, sides,
token ids beside them, each image's tokens); a job batch of images likewise (no texts beside them, never chunked)."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from embedfleet.shared.protocol import EmbedRequest, JobBatch, ProtocolError, TokenChunk, decode_as, encode

PIXELS = np.arange(2 * 3 * 4 * 4, dtype=np.uint8).reshape(2, 3, 4, 4)
CU = np.array([0, 17, 34], np.int32)  # each image counted as its tower's 17 tokens


def _chunk(**changes) -> TokenChunk:
    fields = dict(
        id="r", model="m", start=0, total=2, input_ids=np.zeros(0, np.int32), cu_seqlens=CU, deadline=1.0, pixels=PIXELS
    )
    return TokenChunk(**{**fields, **changes})


def _forged(message: TokenChunk, **keys) -> bytes:
    body = msgpack.unpackb(encode(message), raw=False)
    body.update(keys)
    return msgpack.packb({k: v for k, v in body.items() if v is not None}, use_bin_type=True)


def test_images_and_pixels_round_trip():
    request = decode_as(encode(EmbedRequest("r", "m", [], 1.0, images=[b"\x89PNG...", b"\xff\xd8..."])), EmbedRequest)
    assert request.images == [b"\x89PNG...", b"\xff\xd8..."] and request.count == 2 and request.texts == []
    chunk = decode_as(encode(_chunk()), TokenChunk)
    np.testing.assert_array_equal(chunk.pixels, PIXELS)
    assert (chunk.count, chunk.num_tokens, len(chunk.input_ids)) == (2, 34, 0)


@pytest.mark.parametrize(
    ("keys", "why"),
    [
        ({"pxs": [2, 3, 4, 5]}, "exactly their shape's bytes"),
        ({"pxs": [1, 3, 4, 4]}, "one \\[1 or 3"),
        ({"pxs": [2, 4, 4, 2]}, "one \\[1 or 3"),
        ({"pxs": [2, 3, 0, 24]}, "one \\[1 or 3"),
        ({"pxs": [2, 3, 5000, 1], "px": bytes(2 * 3 * 5000)}, "one \\[1 or 3"),
        ({"pxs": [2, 3, 4]}, "the pixels' shape"),
        ({"pxs": [2, 3, 4, "4"]}, "the pixels' shape"),
        ({"pxs": None}, "pxs"),
        ({"ids": np.ones(34, "<i4").tobytes()}, "no token ids beside them"),
        ({"cu": np.array([0, 17, 34, 51], "<i4").tobytes()}, "per row of the chunk"),
        ({"cu": np.array([0, 17, 17], "<i4").tobytes()}, "cu_seqlens"),
        ({"cu": np.array([0, 70000, 70001], "<i4").tobytes()}, "at most 65536 tokens"),
    ],
)
def test_forged_pixel_chunks_are_refused(keys, why):
    with pytest.raises(ProtocolError, match=why):
        decode_as(_forged(_chunk(), **keys), TokenChunk)


@pytest.mark.parametrize(
    ("keys", "why"),
    [
        ({"x": ["a text"]}, "image inputs come alone"),
        ({"im": [b""]}, "non-empty byte strings"),
        ({"im": ["a string"]}, "non-empty byte strings"),
    ],
)
def test_forged_image_requests_are_refused(keys, why):
    message = EmbedRequest("r", "m", [], 1.0, images=[b"\x89PNG"])
    with pytest.raises(ProtocolError, match=why):
        decode_as(_forged(message, **keys), EmbedRequest)


def test_a_job_batch_of_images_round_trips():
    batch = JobBatch("job", 3, "clip", ["a.png", "b.jpg"], [], images=[b"\x89PNG...", b"\xff\xd8..."])
    back = decode_as(encode(batch), JobBatch)
    assert back == batch and back.count == 2 and back.texts == []
    assert decode_as(encode(JobBatch("job", 0, "m", ["a"], ["text"])), JobBatch).images is None


@pytest.mark.parametrize(
    ("keys", "why"),
    [
        ({"x": ["a text", "another"]}, "holds no texts beside them"),
        ({"im": [b""]}, "non-empty byte strings"),
        ({"im": ["a path.png"]}, "non-empty byte strings"),
        ({"im": b"\x89PNG"}, "'im' must be list"),
        ({"im": [b"\x89PNG"]}, "as many document ids as texts \\(or images\\)"),
        ({"di": []}, "as many document ids"),
        ({"sz": 8}, "not chunked"),
    ],
)
def test_forged_job_batches_of_images_are_refused(keys, why):
    batch = JobBatch("job", 0, "clip", ["a", "b"], [], images=[b"\x89PNG", b"\xff\xd8"])
    with pytest.raises(ProtocolError, match=why):
        decode_as(_forged(batch, **keys), JobBatch)
