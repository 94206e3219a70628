"""OpenAI embeddings API: request validation and response rendering (no I/O here)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from shared.errors import ErrorCode
from services.gateway.errors import ApiError
from services.gateway.inputs import Inputs, Limits, json_object, optional, parse_inputs, positive_dimensions

ENCODING_FORMATS = ("float", "base64")
INPUT_TYPES = ("query", "document")


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    model: str
    inputs: Inputs
    encoding_format: str
    dimensions: int | None
    input_type: str | None = None

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
    return EmbeddingsRequest(model, inputs, encoding_format, positive_dimensions(doc), input_type)


def render_embeddings(model: str, vectors: np.ndarray, tokens: int, encoding_format: str) -> bytes:
    """The OpenAI response body; float rows are serialised by orjson straight from numpy."""
    if encoding_format == "base64":
        rows: list[Any] = [base64.b64encode(row.astype("<f4", copy=False).tobytes()).decode() for row in vectors]
    else:
        rows = list(vectors.astype(np.float32, copy=False))
    data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    return orjson.dumps(
        {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
