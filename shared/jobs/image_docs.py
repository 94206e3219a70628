"""A bulk job's image documents (a two-tower model's: CLIP, SigLIP): read from files, data URIs or a
Parquet column of bytes, each checked before a job is made of it: its size and what its header declares
(format, width x height) against the submitter's ``ImageLimits`` (shared/images/decode.py), no pixel
decoded. Decoding is the tokenizer's, under its own limits.

A document read from a file is not held in memory: an ``ImageDoc`` keeps where the file is, its size and
its SHA-256, and ``read`` reads it again when its batch is published; a file that changed meanwhile is
refused then (``ImageChanged``), never sent as another image. Bytes given inline (a data URI, a Parquet
cell) are held: the input holds them anyway.

A path is taken relative to ``base`` (the input file's folder); with a ``root`` (the gateway's --jobs-dir)
it must resolve inside it, symlinks followed, and messages name it as the input wrote it, never by the
server's folders.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.images.decode import ImageError, ImageLimits, check_header, from_data_uri

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif")  # the files of a folder that are images (any case)


class ImageChanged(ConfigError):
    """An image file read again to be published is not the file checked when the job was submitted."""


@dataclass(frozen=True, slots=True)
class ImageDoc:
    """One image document: its file's ``size`` and ``digest`` (SHA-256, hex), and where the bytes are."""

    name: str  # as the input names it: a path as written, or "a data URI"
    size: int
    digest: str
    path: Path | None = None  # a file, read again when its batch is published
    data: bytes | None = field(default=None, repr=False)  # bytes given inline

    def read(self) -> bytes:
        """The file's bytes, as checked (ImageChanged when the file is not that one any more)."""
        if self.data is not None:
            return self.data
        assert self.path is not None  # an ImageDoc holds its bytes or names its file
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise ImageChanged(f"image {self.name!r} cannot be read any more: {exc.strerror or exc}") from None
        if len(data) != self.size or hashlib.sha256(data).hexdigest() != self.digest:
            raise ImageChanged(
                f"image {self.name!r} changed since the job was submitted: submit the job again (another job id)"
            )
        return data

    @property
    def key(self) -> bytes:
        """What a job's request digest holds of it (shared/jobs/requests.py): its size and digest."""
        return f"image:{self.size}:{self.digest}".encode()


def image_bytes(data: bytes, name: str, limits: ImageLimits) -> ImageDoc:
    """An image given as bytes, its header checked against ``limits``; ImageError otherwise."""
    check_header(data, limits)
    return ImageDoc(name, len(data), hashlib.sha256(data).hexdigest(), data=data)


def image_file(path: Path, name: str, limits: ImageLimits) -> ImageDoc:
    """The image file ``path`` (``name``: as the input names it), its size checked before it is read
    and its header after; ImageError otherwise."""
    try:
        size = path.stat().st_size
        data = path.read_bytes() if size <= limits.max_bytes else b""
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise ImageError(f"cannot read {name[:200]!r}: {getattr(exc, 'strerror', None) or exc}") from None
    if size > limits.max_bytes:  # refused unread
        raise ImageError(f"the image is {size} bytes, over the limit of {limits.max_bytes} bytes")
    check_header(data, limits)
    return ImageDoc(name, len(data), hashlib.sha256(data).hexdigest(), path=path)


def image_field(value: str, base: Path, limits: ImageLimits, root: Path | None = None) -> ImageDoc:
    """A document's ``image`` as an input writes it: a data URI (``data:image/png;base64,...``), or a
    file's path, relative to ``base`` or absolute, inside ``root`` when given; ImageError otherwise."""
    if value.startswith("data:"):
        return image_bytes(from_data_uri(value, limits), "a data URI", limits)
    if not value or "\0" in value:
        raise ImageError("an image's path must be a file's name, without NUL characters")
    try:
        path = (base / value).resolve()
    except (OSError, RuntimeError) as exc:  # too long a name, a symlink loop
        raise ImageError(f"{value[:200]!r} names no usable file: {getattr(exc, 'strerror', None) or exc}") from None
    if root is not None and not path.is_relative_to(root):
        raise ImageError(f"{value[:200]!r} is outside the jobs folder: an image's path must name a file inside it")
    return image_file(path, value, limits)
