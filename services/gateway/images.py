"""Images a request sends, as data URIs: each decoded from base64 and its header checked (format, bytes,
declared pixels) before anything is published, so a refused image costs the fleet nothing; then embedded
beside the request's texts, each through its tower. The tokenizer fleet decodes the pixels (shared/images/).

An image sent as a URL is kept apart (``ImageUrl``) while the request is parsed, which reads no network;
the route's serving step has it fetched (services/gateway/image_fetch.py, from --image-hosts only), checks
its file as a data URI's, and puts it in its place among the request's images (``placed``)."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Sequence
from typing import TypeVar

import numpy as np

from embedfleet.services.gateway.core import Embedder
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Inputs, Limits, within_count, within_limits
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.images.decode import ImageError, ImageLimits, check_header, from_data_uri
from embedfleet.shared.nats.embed_client import EmbedOutcome
from embedfleet.shared.protocol import EmbedOptions


def image_files(uris: list[str], where: list[str], limits: ImageLimits) -> list[bytes]:
    """The files of ``uris`` (data URIs), checked against ``limits``; ``where`` names each in the
    request ("input[2]"), for the 400 that refuses it."""
    return [file for file, _ in checked_images(uris, where, limits)]


def checked_images(uris: list[str], where: list[str], limits: ImageLimits) -> list[tuple[bytes, ImageHeader]]:
    """``image_files``, each with what its header says."""
    out = []
    for uri, at in zip(uris, where, strict=True):
        try:
            data = from_data_uri(uri, limits)
        except ImageError as exc:
            raise refused(at, exc) from None
        out.append(checked_file(data, at, limits))
    return out


def checked_file(data: bytes, at: str, limits: ImageLimits) -> tuple[bytes, ImageHeader]:
    """An image file (a data URI's, or a URL's once fetched) and what its header says, once the header is
    checked against ``limits``; ApiError naming ``at`` otherwise."""
    try:
        fmt, width, height = check_header(data, limits)
    except ImageError as exc:
        raise refused(at, exc) from None
    # a PNG's IHDR says its bit depth (byte 24); the other formats served hold 8-bit samples
    return data, ImageHeader(fmt, width, height, data[24] if fmt == "PNG" else 8)


def refused(at: str, exc: ImageError) -> ApiError:
    """The 400 that refuses the image at ``at`` ("input[2]") for what ``exc`` says."""
    return ApiError(ErrorCode.INVALID_REQUEST, f"'{at}': {exc}", at.split("[")[0])


# a URL (a scheme and "//"), not a data URI: fetched once the request is parsed, where --image-hosts allows
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


@dataclasses.dataclass(frozen=True, slots=True)
class ImageUrl:
    """An image a request names by URL, fetched (image_fetch.py) before the request is embedded."""

    at: int  # its place among the request's images (image_rows[at] is its input)
    url: str
    where: str  # "input[2]": what the 400 that refuses it names


def sources(
    uris: list[str], where: list[str], limits: ImageLimits
) -> tuple[list[tuple[bytes, ImageHeader]], tuple[ImageUrl, ...]]:
    """A request's images as sent: the data URIs' files checked now (``checked_images``, in order), the
    URLs kept to be fetched in the serving step."""
    urls = tuple(ImageUrl(i, uri, at) for i, (uri, at) in enumerate(zip(uris, where, strict=True)) if _URL.match(uri))
    fetched = {url.at for url in urls}
    inline = [i for i in range(len(uris)) if i not in fetched]
    return checked_images([uris[i] for i in inline], [where[i] for i in inline], limits), urls


T = TypeVar("T")


def placed(inline: Sequence[T], urls: Sequence[ImageUrl], fetched: Sequence[T]) -> list[T]:
    """Every image of a request in its order: ``inline`` (those sent as data URIs, in order) with
    ``fetched`` (those ``urls`` name, one each) put in their places."""
    out = list(inline)
    for url, item in zip(urls, fetched, strict=True):  # places ascending: each lands where it belongs
        out.insert(url.at, item)
    return out


def split_items(
    items: Sequence[tuple[str | None, str | None]], param: str, limits: Limits
) -> tuple[Inputs, Inputs | None, tuple[int, ...], tuple[ImageUrl, ...]]:
    """Jina's input items, each (text, image data URI or URL) with one of them set: (the texts, the images
    sent as data URIs or None when there is no image, the index in ``param`` of each image, the images to
    fetch); the count checked before any image is decoded."""
    within_count(len(items), param, limits)
    rows = tuple(i for i, (_, image) in enumerate(items) if image is not None)
    texts = within_limits(Inputs([text for text, _ in items if text is not None], None), param, limits)
    if not rows:
        return texts, None, rows, ()
    uris = [items[i][1] or "" for i in rows]
    checked, urls = sources(uris, [f"{param}[{i}]" for i in rows], limits.images)
    return texts, Inputs([], None, [file for file, _ in checked]), rows, urls


@dataclasses.dataclass(frozen=True, slots=True)
class ImageHeader:
    format: str  # "PNG", "JPEG", "WEBP", "GIF"
    width: int
    height: int
    bit_depth: int


async def embed_with_images(
    fleet: Embedder, model: str, texts: Inputs, images: Inputs, image_rows: Sequence[int], options: EmbedOptions
) -> EmbedOutcome:
    """A request's ``images`` (its inputs ``image_rows``) and the ``texts`` beside them (its other inputs,
    in order), embedded side by side, each through its tower, the rows put back in the request's order."""
    rows = list(image_rows)
    if not texts.count:
        return await fleet.run_embed(model, images, options, rows=rows)
    is_image = np.zeros(texts.count + images.count, dtype=bool)
    is_image[rows] = True
    said, shown = await asyncio.gather(
        fleet.run_embed(model, texts, options, rows=np.flatnonzero(~is_image).tolist()),
        fleet.run_embed(model, images, options, rows=rows),
    )
    stages = {**said.timings, **shown.timings}
    timings = {k: max(said.timings.get(k, 0.0), shown.timings.get(k, 0.0)) for k in stages}
    tokens = said.tokens + shown.tokens
    if said.ragged is not None and shown.ragged is not None:  # per input its vectors (a page model's multi-vectors)
        ragged: list = [None] * len(is_image)
        for at, item in zip(np.flatnonzero(~is_image).tolist(), said.ragged):
            ragged[at] = item
        for at, item in zip(rows, shown.ragged):
            ragged[at] = item
        return dataclasses.replace(said, ragged=ragged, tokens=tokens, timings=timings)
    vectors = np.empty((len(is_image), *said.vectors.shape[1:]), dtype=said.vectors.dtype)
    vectors[~is_image], vectors[is_image] = said.vectors, shown.vectors
    return dataclasses.replace(said, vectors=vectors, tokens=tokens, timings=timings)
