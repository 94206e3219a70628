"""OpenAI embeddings API: request validation and response rendering (no I/O here)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from pydantic_core import ErrorDetails

from embedfleet.services.gateway.chunking import Chunking, body_chunking, chunk_places
from embedfleet.services.gateway.http.body_errors import input_fault, read_body
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.images import ImageUrl, sources, split_items
from embedfleet.services.gateway.inputs import Inputs, Limits, typed_inputs, within_count
from embedfleet.services.gateway.openai.body import EmbeddingsBody, InputItem
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.vectors.forms import EMBEDDING_TYPES, FORMS


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    model: str
    inputs: Inputs
    encoding_format: str
    dimensions: int | None
    input_type: str | None = None
    embedding_type: str = "float32"  # the vector form (shared/vectors/forms.py); 'float' in the request is float32
    chunking: Chunking | None = None  # long inputs cut into chunks (services/gateway/chunking.py)
    task: str | None = None  # a task adapter of the model (EmbedOptions.task)
    # {'image': ...} items: the images sent as data URIs (``inputs`` holds the texts beside them, if any) and
    # the index in ``input`` of each image; None: no images
    images: Inputs | None = None
    image_rows: tuple[int, ...] = ()
    image_urls: tuple[ImageUrl, ...] = ()  # the images sent as URLs, fetched before they are embedded

    @property
    def texts(self) -> list[str]:
        return self.inputs.texts


def _input_fault(errors: list[ErrorDetails]) -> ApiError:
    return input_fault(errors, "input")


def parse_embeddings_request(body: bytes, limits: Limits) -> EmbeddingsRequest:
    """The request ``body`` holds (EmbeddingsBody), within the gateway's ``limits``; ApiError otherwise."""
    doc = read_body(EmbeddingsBody, body, _input_fault)
    images: Inputs | None = None
    image_rows: tuple[int, ...] = ()
    image_urls: tuple[ImageUrl, ...] = ()
    if doc.modality == "image":  # infinity's form: every string of 'input' an image
        uris = [doc.input] if isinstance(doc.input, str) else doc.input
        if not all(isinstance(uri, str) for uri in uris):
            raise ApiError(
                ErrorCode.INVALID_REQUEST, "with modality 'image', 'input' holds data URIs or URLs (strings)", "input"
            )
        within_count(len(uris), "input", limits)
        where = [f"input[{i}]" for i in range(len(uris))]
        checked, image_urls = sources([str(uri) for uri in uris], where, limits.images)
        images = Inputs([], None, [file for file, _ in checked])
        image_rows = tuple(range(len(uris)))
        inputs = Inputs([], None)
    elif isinstance(doc.input, list) and isinstance(doc.input[0], InputItem):
        items = [(item.text, item.image) for item in doc.input if isinstance(item, InputItem)]  # the <items> member
        inputs, images, image_rows, image_urls = split_items(items, "input", limits)
    else:
        inputs = typed_inputs(doc.input, "input", limits)
    if images is not None and doc.chunking is not None:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'chunking' cuts texts; images cannot be chunked", "chunking")
    return EmbeddingsRequest(
        doc.model,
        inputs,
        doc.encoding_format or "float",
        doc.dimensions,
        doc.input_type,
        EMBEDDING_TYPES[doc.embedding_type or "float"].name,
        None if doc.chunking is None else body_chunking(doc.chunking, inputs, "input"),
        doc.task,
        images,
        image_rows,
        image_urls,
    )


def render_embeddings(
    model: str,
    vectors: np.ndarray,
    tokens: int,
    encoding_format: str,
    form: str = "float32",
    chunks: list | None = None,
) -> bytes:
    """The OpenAI response body. ``vectors``: [n, width(dim)] rows of ``form``.

    "float": each row as JSON numbers, serialised by orjson straight from numpy (integers for int8,
    uint8 and the packed bytes of binary / ubinary, as Cohere answers them); "base64": each row's
    little-endian bytes in that form. ``chunks``: per input its TextChunks, one row each (the rows
    input by input): each item then names its input, its chunk and the chunk's characters."""
    stored = vectors.astype(FORMS[form].dtype, copy=False)
    if encoding_format == "base64":
        rows: list[Any] = [base64.b64encode(row.tobytes()).decode() for row in stored]
    else:
        rows = list(stored)
    if chunks is None:
        data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    else:
        data = [{"object": "embedding", **place, "embedding": row} for place, row in zip(chunk_places(chunks), rows)]
    return orjson.dumps(
        {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
