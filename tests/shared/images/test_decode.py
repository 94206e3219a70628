"""Untrusted images: data URIs decoded strictly and sized before decoding, headers read without Pillow
(sizes equal to Pillow's), images refused before a pixel is decoded when their header is over the
limit, and every refusal's message exactly what the client reads."""

from __future__ import annotations

import base64
import io
import struct
import time
import warnings
import zlib
from typing import Any

import numpy as np
import pytest
from PIL import Image

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.images.decode import (
    ImageError,
    ImageLimits,
    check_header,
    from_data_uri,
    header_size,
    open_image,
)

LIMITS = ImageLimits()


def _noise(width: int, height: int, mode: str = "RGB") -> Image.Image:
    channels = len(Image.new(mode, (1, 1)).getbands())
    pixels = np.random.default_rng(width * 31 + height).integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode)


def _encoded(image: Image.Image, fmt: str, **save: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **save)
    return buffer.getvalue()


def _uri(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def _refusal(call, *args) -> str:
    with pytest.raises(ImageError) as refused:
        call(*args)
    return str(refused.value)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png_header(width: int, height: int) -> bytes:
    """A PNG that says it is width x height (8-bit RGB) with a few bytes of image data: valid chunks, CRCs
    and all, but decoding it would need width * height * 3 bytes."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


@pytest.mark.parametrize(
    ("fmt", "media_type", "save"),
    [("PNG", "image/png", {}), ("WEBP", "image/webp", {"lossless": True}), ("JPEG", "IMAGE/JPEG", {"quality": 85})],
)
def test_data_uris_round_trip(fmt, media_type, save):
    original = _noise(67, 45)
    data = _encoded(original, fmt, **save)
    assert from_data_uri(_uri(data, media_type), LIMITS) == data
    image = open_image(from_data_uri(_uri(data, media_type), LIMITS), LIMITS)
    assert (image.format, image.mode, image.size) == (fmt, "RGB", (67, 45))
    expected = original if fmt != "JPEG" else Image.open(io.BytesIO(data))  # lossy: what Pillow decodes
    assert np.array_equal(np.asarray(image), np.asarray(expected))


@pytest.mark.parametrize(
    ("image", "fmt", "save"),
    [
        (_noise(300, 7), "PNG", {}),
        (_noise(7, 300, "L"), "JPEG", {"progressive": True}),
        (_noise(513, 257, "CMYK"), "JPEG", {}),
        (_noise(40, 90), "GIF", {}),
        (_noise(129, 33), "WEBP", {"lossless": False}),  # VP8
        (_noise(33, 129), "WEBP", {"lossless": True}),  # VP8L
        (_noise(31, 17, "RGBA"), "WEBP", {"exif": b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\x00\x00"}),  # VP8X
    ],
)
def test_header_size_is_pillows_size(image, fmt, save):
    data = _encoded(image, fmt, **save)
    assert header_size(data) == (fmt, *Image.open(io.BytesIO(data)).size) == (fmt, *image.size)


def test_a_gif_grown_to_hold_its_first_frame():
    """A first frame that overflows the logical screen: Pillow grows the image, and so does the header's size."""
    data = bytearray(_encoded(_noise(20, 10), "GIF"))
    data[6:10] = struct.pack("<HH", 5, 5)  # logical screen 5x5, frame 20x10 at (0, 0)
    assert header_size(bytes(data)) == ("GIF", 20, 10) == ("GIF", *Image.open(io.BytesIO(bytes(data))).size)


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        (
            "https://example.com/cat.png",
            "an image must be a data URI (data:image/png;base64,...); URLs are not fetched; got 'https://example.com/cat.png'",
        ),
        (
            "data:image/png;base64",
            "the data URI 'data:image/png;base64' has no ',' after its media type (data:image/png;base64,...)",
        ),
        (
            "data:image/png,iVBORw0KGgo=",
            "the data URI must be base64-encoded (data:image/png;base64,...), got 'data:image/png'",
        ),
        (
            "data:image/png;charset=utf-8;base64,AAAA",
            "the data URI must be base64-encoded (data:image/png;base64,...), got 'data:image/png;charset=utf-8;base64'",
        ),
        (
            "data:text/plain;base64,aGVsbG8=",
            "the data URI's media type 'text/plain' is not one of image/png, image/jpeg, image/webp, image/gif",
        ),
        (
            "data:image/svg+xml;base64,PHN2Zz4=",
            "the data URI's media type 'image/svg+xml' is not one of image/png, image/jpeg, image/webp, image/gif",
        ),
        ("data:image/png;base64,", "the data URI holds no image data"),
        ("data:image/png;base64,iVBO Rw0K", "the data URI's payload is not valid base64: Only base64 data is allowed"),
        ("data:image/png;base64,iVBORw0KGg", "the data URI's payload is not valid base64: Incorrect padding"),
        ("data:image/png;base64,iVBORw0-", "the data URI's payload is not valid base64: Only base64 data is allowed"),
        (
            "data:image/png;base64,iVBORw0é",
            "the data URI's payload is not valid base64: string argument should contain only ASCII characters",
        ),
    ],
)
def test_data_uri_refusals(uri, message):
    assert _refusal(from_data_uri, uri, LIMITS) == message


def test_a_payload_over_max_bytes_is_refused_without_decoding():
    limits = ImageLimits(max_bytes=1000)
    assert from_data_uri("data:image/png;base64," + "A" * 1332 + "==", limits) == bytes(
        1000 - 1
    )  # 1332 / 4 * 3 - 2 = 997
    assert _refusal(from_data_uri, "data:image/png;base64," + "A" * 1336, limits) == (
        "the image is 1002 bytes, over the limit of 1000 bytes"
    )
    # invalid base64 throughout: it was never decoded, or the message would say so; and it takes no time
    huge = "data:image/png;base64," + "!" * (120 * 1024 * 1024)
    started = time.perf_counter()
    assert (
        _refusal(from_data_uri, huge, LIMITS)
        == f"the image is {90 * 1024 * 1024} bytes, over the limit of {20 * 1024 * 1024} bytes"
    )
    assert time.perf_counter() - started < 0.05


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "the image is empty (0 bytes)"),
        (
            b"hello, I am a text file renamed cat.png\n",
            "the image is not a PNG, JPEG, WebP or GIF file (its first bytes are 68 65 6c 6c 6f 2c 20 49)",
        ),
        (
            b"BM\x36\x00\x00\x00\x00\x00\x00\x00",
            "the image is not a PNG, JPEG, WebP or GIF file (its first bytes are 42 4d 36 00 00 00 00 00)",
        ),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "the PNG image's header is truncated or invalid: no IHDR chunk first"),
        (
            b"\xff\xd8\xff\xe0\x00\x10JFIF",
            "the JPEG image's header is truncated or invalid: it ends before its image data",
        ),
        (b"\xff\xd8\xff\xd9", "the JPEG image's header is truncated or invalid: it ends (EOI) before its image data"),
        (
            b"GIF89a\x01\x00\x01\x00\x00\x00\x00;",
            "the GIF image's header is truncated or invalid: it ends (trailer) before any image",
        ),
        (
            b"RIFF\x00\x00\x00\x00WEBPVP8Z",
            "the WEBP image's header is truncated or invalid: no VP8, VP8L or VP8X chunk first (found b'VP8Z')",
        ),
        (_png_header(0, 10), "the PNG image's header says it is 0x10 pixels: it has no pixels"),
    ],
)
def test_header_refusals(data, message):
    assert _refusal(open_image, data, LIMITS) == message
    assert _refusal(header_size, data) == message


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_a_truncated_file_is_refused(fmt):
    data = _encoded(_noise(200, 150), fmt)
    message = _refusal(open_image, data[: len(data) // 2], LIMITS)
    assert message.startswith(f"the {fmt} image cannot be decoded: image file is truncated"), message


def test_a_corrupt_file_is_refused():
    data = bytearray(_encoded(_noise(20, 20), "PNG"))
    data[40:60] = bytes(20)  # inside the image data: its chunk's CRC no longer matches
    assert _refusal(open_image, bytes(data), LIMITS).startswith("the PNG image cannot be decoded: ")
    # a header Pillow refuses: 12-bit JPEG samples
    jpeg = bytearray(_encoded(_noise(20, 20), "JPEG"))
    sof = jpeg.index(b"\xff\xc0")
    jpeg[sof + 4] = 12
    assert _refusal(open_image, bytes(jpeg), LIMITS) == "the JPEG image cannot be decoded: not a valid file of its kind"


def test_a_huge_png_header_is_refused_before_decoding():
    """50,000 x 50,000 in a file of ~100 bytes: refused from its header, by this check (Pillow's own would
    raise DecompressionBombError, with its own message), with no warning and Pillow's limit unchanged."""
    data = _png_header(50_000, 50_000)
    assert len(data) < 200 and header_size(data) == ("PNG", 50_000, 50_000)
    pillow_limit = Image.MAX_IMAGE_PIXELS
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        message = _refusal(open_image, data, LIMITS)
        # over our limit, under Pillow's (which would warn above 89.5 M): our check, not Pillow's
        assert _refusal(open_image, _png_header(8000, 8000), LIMITS) == (
            "the image is 8000x8000 = 64000000 pixels, over the limit of 40000000 pixels"
        )
    assert message == "the image is 50000x50000 = 2500000000 pixels, over the limit of 40000000 pixels"
    assert _refusal(check_header, data, LIMITS) == message  # the gateway's check
    assert pillow_limit == Image.MAX_IMAGE_PIXELS


def test_pillows_lower_limit_is_kept(monkeypatch):
    """A program that lowered Pillow's limit keeps it: refused at it, without Pillow's warning."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    data = _encoded(_noise(40, 40), "PNG")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _refusal(open_image, data, LIMITS) == "the image is 40x40 = 1600 pixels, over the limit of 1000 pixels"
        assert open_image(_encoded(_noise(40, 25), "PNG"), LIMITS).size == (40, 25)
    assert check_header(data, LIMITS) == ("PNG", 40, 40)  # the gateway's check: its own limit only


def test_a_file_over_max_bytes_is_refused():
    data = _encoded(_noise(64, 64), "PNG")
    assert _refusal(open_image, data, ImageLimits(max_bytes=100)) == (
        f"the image is {len(data)} bytes, over the limit of 100 bytes"
    )


@pytest.mark.parametrize("fmt", ["GIF", "PNG", "WEBP"])
def test_an_animation_is_refused(fmt):
    frames = [_noise(30, 20), _noise(30, 21).crop((0, 0, 30, 20))]
    data = _encoded(frames[0], fmt, save_all=True, append_images=frames[1:], duration=100)
    assert _refusal(open_image, data, LIMITS) == f"the {fmt} image is animated: send a still image (one frame)"


def test_a_one_frame_gif_is_taken():
    image = open_image(_encoded(_noise(30, 20), "GIF", transparency=0), LIMITS)
    assert (image.format, image.mode, image.size, image.info["transparency"]) == ("GIF", "P", (30, 20), 0)


def test_cmyk_jpeg_and_16_bit_png_are_taken_as_they_are():
    cmyk = open_image(_encoded(_noise(33, 22, "CMYK"), "JPEG"), LIMITS)
    sixteen = Image.fromarray(np.arange(24 * 10, dtype=np.uint16).reshape(10, 24) * 271)
    deep = open_image(_encoded(sixteen, "PNG"), LIMITS)
    assert (cmyk.mode, cmyk.size, deep.mode, deep.size) == ("CMYK", (33, 22), "I;16", (24, 10))
    assert np.array_equal(np.asarray(deep), np.asarray(sixteen))


@pytest.mark.parametrize("field", ["max_bytes", "max_pixels"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_limits_must_be_positive_integers(field, value):
    with pytest.raises(ConfigError) as refused:
        ImageLimits(**{field: value})
    assert str(refused.value) == f"image limit {field} must be a positive integer, got {value!r}"
