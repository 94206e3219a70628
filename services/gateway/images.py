"""Images a request sends, as data URIs: each decoded from base64 and its header checked (format, bytes,
declared pixels) before anything is published, so a refused image costs the fleet nothing; then embedded
beside the request's texts, each through its tower. The tokenizer fleet decodes the pixels (shared/images/)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

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
            fmt, width, height = check_header(data, limits)
        except ImageError as exc:
            raise ApiError(ErrorCode.INVALID_REQUEST, f"'{at}': {exc}", at.split("[")[0]) from None
        # a PNG's IHDR says its bit depth (byte 24); the other formats served hold 8-bit samples
        out.append((data, ImageHeader(fmt, width, height, data[24] if fmt == "PNG" else 8)))
    return out


def split_items(
    items: Sequence[tuple[str | None, str | None]], param: str, limits: Limits
) -> tuple[Inputs, Inputs | None, tuple[int, ...]]:
    """Jina's input items, each (text, image data URI) with one of them set: (the texts, the images or
    None, the index in ``param`` of each image); the count checked before any image is decoded."""
    within_count(len(items), param, limits)
    rows = tuple(i for i, (_, image) in enumerate(items) if image is not None)
    texts = within_limits(Inputs([text for text, _ in items if text is not None], None), param, limits)
    if not rows:
        return texts, None, rows
    uris = [items[i][1] or "" for i in rows]
    return texts, Inputs([], None, image_files(uris, [f"{param}[{i}]" for i in rows], limits.images)), rows


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
