"""OpenAI embeddings API: request validation and response rendering (no I/O here)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from services.gateway.chunking import Chunking, chunk_places, parse_text_chunking
from services.gateway.errors import ApiError
from services.gateway.inputs import (
    Inputs,
    Limits,
    embedding_form,
    json_object,
    optional,
    parse_inputs,
    positive_dimensions,
)
from shared.errors import ErrorCode
from shared.vector_forms import FORMS

ENCODING_FORMATS = ("float", "base64")
INPUT_TYPES = ("query", "document")


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    model: str
    inputs: Inputs
    encoding_format: str
    dimensions: int | None
    input_type: str | None = None
    embedding_type: str = "float32"  # the vector form (shared/vector_forms.py); 'float' in the request is float32
    chunking: Chunking | None = None  # long inputs cut into chunks (services/gateway/chunking.py)

    @property
    def texts(self) -> list[str]:
        return self.inputs.texts


def parse_embeddings_request(body: bytes, limits: Limits) -> EmbeddingsRequest:
    doc = json_object(body)
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'model' is required and must be a string", "model")
    if "input" not in doc:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'input' is required", "input")
    inputs = parse_inputs(doc["input"], "input", limits, allow_tokens=True)
    encoding_format = optional(doc, "encoding_format", str, "float")
    if encoding_format not in ENCODING_FORMATS:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'encoding_format' must be 'float' or 'base64'", "encoding_format")
    optional(doc, "user", str)
    input_type = optional(doc, "input_type", str)
    if input_type is not None and input_type not in INPUT_TYPES:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'input_type' must be 'query' or 'document'", "input_type")
    chunking = parse_text_chunking(doc, inputs, "input")
    return EmbeddingsRequest(
        model, inputs, encoding_format, positive_dimensions(doc), input_type, embedding_form(doc), chunking
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
