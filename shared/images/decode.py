"""Untrusted image bytes: a data URI's payload, the format and size its header declares, and the image
decoded under ``ImageLimits``.

Every check that can refuse an image runs before the work it protects: a data URI's size is known from
its base64 length before it is decoded, an image's width and height from its header before a pixel is
decoded. The header is read here by hand (PNG's IHDR, JPEG's SOF segment, GIF's screen and first image
descriptor, WebP's VP8/VP8L/VP8X chunk: the fields Pillow itself reads), so ``header_size`` and
``check_header`` need no Pillow (the gateway's use), and Pillow never sees an image over its own
decompression-bomb limit: it would warn, or raise, from a process-wide setting this module never changes.

Anything wrong with an image raises ``ImageError``, whose message is what the HTTP client reads.
"""

from __future__ import annotations

import base64
import binascii
import io
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.errors import shown

if TYPE_CHECKING:
    from PIL import Image

MIB = 1 << 20
# what a data URI may say it holds; the bytes' own format is sniffed, and must be one of FORMATS
MEDIA_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif")
FORMATS = ("PNG", "JPEG", "WEBP", "GIF")  # Pillow's names for them
# a JPEG's segments before its image data (APPn, DQT, DHT, SOF...; a real file has tens): more is refused
# before it costs a loop per segment
_MAX_JPEG_SEGMENTS = 1000
_SOF_MARKERS = frozenset({*range(0xC0, 0xD0), 0xDE}) - {0xC4, 0xC8, 0xCC}  # SOF0..15 and DHP, as Pillow


@dataclass(frozen=True, slots=True)
class ImageLimits:
    """How large an image a client may send.

    ``max_bytes``: the encoded file (a data URI's payload once decoded), checked before it is decoded.
    ``max_pixels``: width * height as the file's header declares them, checked before a pixel is decoded
    (an RGB image of 40 M pixels is 120 MB in memory). Pillow's own limit (``Image.MAX_IMAGE_PIXELS``,
    89.5 M pixels unless a program changes it) caps it further where an image is decoded.
    """

    max_bytes: int = 20 * MIB
    max_pixels: int = 40_000_000

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_pixels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"image limit {name} must be a positive integer, got {value!r}")


class ImageError(ValueError):
    """An image a client sent that is refused: the message says what was wrong (and the limit it broke)
    and travels back to the client as a 4xx."""


def from_data_uri(uri: str, limits: ImageLimits) -> bytes:
    """The bytes of ``data:image/<png|jpeg|webp|gif>;base64,<payload>``.

    The payload's decoded size follows from its length (4 characters a 3 bytes, less its '=' padding),
    so an image over ``limits.max_bytes`` is refused before any of it is decoded or copied; the rest is
    decoded strictly (only the base64 alphabet, correct padding, no whitespace).
    """
    if not uri.startswith("data:"):
        raise ImageError(
            f"an image must be a data URI (data:image/png;base64,...); URLs are not fetched; got {shown(uri[:40])}"
        )
    comma = uri.find(",", 0, 100)  # the media type is short: a huge payload is not scanned for a comma
    if comma < 0:
        raise ImageError(f"the data URI {shown(uri[:40])} has no ',' after its media type (data:image/png;base64,...)")
    media_type, _, encoding = uri[5:comma].partition(";")
    media_type = media_type.lower()  # RFC 2397: media types are case-insensitive
    if media_type not in MEDIA_TYPES:
        raise ImageError(f"the data URI's media type {shown(media_type)} is not one of {', '.join(MEDIA_TYPES)}")
    if encoding.lower() != "base64":
        raise ImageError(
            f"the data URI must be base64-encoded (data:{media_type};base64,...), got {shown(uri[:comma])}"
        )
    length = len(uri) - comma - 1
    if length == 0:
        raise ImageError("the data URI holds no image data")
    padding = 2 if uri.endswith("==") else 1 if uri.endswith("=") else 0
    size = length // 4 * 3 - padding  # exact for valid base64; invalid base64 is refused below anyway
    if size > limits.max_bytes:
        raise ImageError(_too_large(size, limits))
    try:
        data = base64.b64decode(uri[comma + 1 :], validate=True)
    except (binascii.Error, ValueError) as exc:  # ValueError: a non-ASCII character
        raise ImageError(f"the data URI's payload is not valid base64: {exc}") from None
    if len(data) > limits.max_bytes:  # padding in odd places can make the estimate low; never by much
        raise ImageError(_too_large(len(data), limits))
    return data


def header_size(data: bytes) -> tuple[str, int, int]:
    """(format, width, height) from the image's header alone: format is one of ``FORMATS``; nothing is
    decoded. A GIF's size is its screen grown to hold its first frame, as Pillow sizes it."""
    fmt = _sniff(data)
    width, height = _HEADERS[fmt](data)
    if width <= 0 or height <= 0:
        raise ImageError(f"the {fmt} image's header says it is {width}x{height} pixels: it has no pixels")
    return fmt, width, height


def check_header(data: bytes, limits: ImageLimits) -> tuple[str, int, int]:
    """``header_size`` once the file's size and the declared width * height are checked against
    ``limits`` (what the gateway checks before it publishes an image)."""
    if len(data) > limits.max_bytes:
        raise ImageError(_too_large(len(data), limits))
    fmt, width, height = header_size(data)
    _check_pixels(width, height, limits.max_pixels)
    return fmt, width, height


def open_image(data: bytes, limits: ImageLimits) -> Image.Image:
    """The image ``data`` holds, its pixels loaded, as Pillow opens it (mode, palette and transparency
    kept, no EXIF rotation: ``Image.open(BytesIO(data))`` hands transformers the same image).

    Refused with ``ImageError``: a file over ``limits.max_bytes``; a format other than PNG, JPEG, WebP
    or GIF (sniffed from the bytes); a header declaring more than ``limits.max_pixels`` (or Pillow's own
    limit, if lower), before any pixel is decoded; an animated GIF, PNG or WebP; a truncated or corrupt file.
    """
    from PIL import Image, UnidentifiedImageError

    fmt, width, height = check_header(data, limits)
    ceiling = _pixel_ceiling(limits, Image.MAX_IMAGE_PIXELS)
    _check_pixels(width, height, ceiling)  # Pillow's own limit may be lower: it would warn, then raise
    try:
        image = Image.open(io.BytesIO(data), formats=[fmt])
        if image.size != (width, height):  # Pillow read the header otherwise: its size is the one decoded
            _check_pixels(*image.size, ceiling)
        # frames past the first are skipped over, not decoded; a JPEG's extra pictures (MPO) are not
        # animation, and frame 0 is the photo
        if fmt != "JPEG" and getattr(image, "is_animated", False):
            raise ImageError(f"the {fmt} image is animated: send a still image (one frame)")
        image.load()
    except ImageError:
        raise
    # Pillow's errors for a truncated or corrupt file: OSError ("image file is truncated"),
    # SyntaxError ("broken PNG file"), ValueError, EOFError, struct.error
    except (OSError, SyntaxError, ValueError, EOFError, struct.error, Image.DecompressionBombError) as exc:
        # UnidentifiedImageError's message names the BytesIO object, nothing a client can use
        reason = "not a valid file of its kind" if isinstance(exc, UnidentifiedImageError) else str(exc)[:200]
        raise ImageError(f"the {fmt} image cannot be decoded: {reason}") from None
    return image


def _too_large(size: int, limits: ImageLimits) -> str:
    return f"the image is {size} bytes, over the limit of {limits.max_bytes} bytes"


def _pixel_ceiling(limits: ImageLimits, pillow_limit: int | float | None) -> int:
    """The pixels an image may have where Pillow decodes it: Pillow warns above its MAX_IMAGE_PIXELS
    (and raises above twice it), so an image is refused below both."""
    return limits.max_pixels if pillow_limit is None else min(limits.max_pixels, int(pillow_limit))


def _check_pixels(width: int, height: int, limit: int) -> None:
    if width * height > limit:
        raise ImageError(f"the image is {width}x{height} = {width * height} pixels, over the limit of {limit} pixels")


def _sniff(data: bytes) -> str:
    if not data:
        raise ImageError("the image is empty (0 bytes)")
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    raise ImageError(f"the image is not a PNG, JPEG, WebP or GIF file (its first bytes are {data[:8].hex(' ')})")


def _bad_header(fmt: str, what: str) -> ImageError:
    return ImageError(f"the {fmt} image's header is truncated or invalid: {what}")


def _png_size(data: bytes) -> tuple[int, int]:
    # signature (8), then the IHDR chunk: length (4), b"IHDR", width (4), height (4), big-endian
    if len(data) < 24 or data[12:16] != b"IHDR":
        raise _bad_header("PNG", "no IHDR chunk first")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _jpeg_size(data: bytes) -> tuple[int, int]:
    # segments after SOI: 0xFF, a marker byte, then (most markers) a big-endian length counting itself;
    # the size is in the last start-of-frame segment before the first scan (SOS), as Pillow reads it
    at, size, segments = 2, None, 0
    while True:
        if at + 2 > len(data):
            raise _bad_header("JPEG", "it ends before its image data")
        if data[at] != 0xFF:
            raise _bad_header("JPEG", f"no segment marker at byte {at}")
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte before a marker
            at += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # markers without a length
            at += 2
            continue
        if marker == 0xDA:  # start of scan: the header is over
            break
        if marker == 0xD9:
            raise _bad_header("JPEG", "it ends (EOI) before its image data")
        segments += 1
        if segments > _MAX_JPEG_SEGMENTS:
            raise _bad_header("JPEG", f"more than {_MAX_JPEG_SEGMENTS} segments before its image data")
        if at + 4 > len(data):
            raise _bad_header("JPEG", "a segment's length is cut off")
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if marker in _SOF_MARKERS:
            if length < 7 or at + 9 > len(data):  # precision (1), height (2), width (2)
                raise _bad_header("JPEG", "its start-of-frame segment is cut off")
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            size = (width, height)
        at += 2 + max(length, 2)
    if size is None:
        raise _bad_header("JPEG", "no start-of-frame segment before its image data")
    return size


def _gif_size(data: bytes) -> tuple[int, int]:
    # header (6), logical screen width and height (little-endian), flags, background, aspect; then the
    # global color table, extensions (sub-blocks) and the first image descriptor (b",", x0, y0, w, h)
    if len(data) < 13:
        raise _bad_header("GIF", "no logical screen descriptor")
    screen_width, screen_height = struct.unpack("<HH", data[6:10])
    flags = data[10]
    at = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    while at < len(data):
        block = data[at]
        if block == 0x21:  # extension: label, then sub-blocks (a length byte each, 0 ends them)
            at += 2
            while at < len(data) and data[at]:
                at += 1 + data[at]
            at += 1
        elif block == 0x2C:
            if at + 9 > len(data):
                raise _bad_header("GIF", "its image descriptor is cut off")
            x0, y0, width, height = struct.unpack("<HHHH", data[at + 1 : at + 9])
            # Pillow grows the image to hold a first frame that overflows the screen
            return max(screen_width, x0 + width), max(screen_height, y0 + height)
        elif block == 0x3B:
            raise _bad_header("GIF", "it ends (trailer) before any image")
        else:
            raise _bad_header("GIF", f"unknown block 0x{block:02x} at byte {at}")
    raise _bad_header("GIF", "it ends before any image")


def _webp_size(data: bytes) -> tuple[int, int]:
    # RIFF header (12), then the first chunk's fourcc at 12: Pillow's own reading of the canvas size
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])  # 14 bits each, 2 bits of scaling above
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        (bits,) = struct.unpack("<I", data[21:25])  # width - 1 and height - 1, 14 bits each
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:  # canvas width - 1 and height - 1, 24 bits each
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    raise _bad_header("WEBP", f"no VP8, VP8L or VP8X chunk first (found {shown(chunk)})")


_HEADERS: dict[str, Callable[[bytes], tuple[int, int]]] = {
    "PNG": _png_size,
    "JPEG": _jpeg_size,
    "GIF": _gif_size,
    "WEBP": _webp_size,
}
