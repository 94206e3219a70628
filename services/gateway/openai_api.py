"""OpenAI embeddings API: request validation and response rendering (no I/O here)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from shared.errors import ErrorCode
from services.gateway.errors import ApiError

ENCODING_FORMATS = ("float", "base64")


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    model: str
    texts: list[str]
    encoding_format: str
    dimensions: int | None


def parse_embeddings_request(body: bytes, max_inputs: int) -> EmbeddingsRequest:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ApiError(ErrorCode.INVALID_REQUEST, "request body must be a JSON object")

    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'model' is required and must be a string", "model")

    if "input" not in doc:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'input' is required", "input")
    raw = doc["input"]
    if isinstance(raw, str):
        texts = [raw]
    elif isinstance(raw, list):
        if not raw:
            raise ApiError(ErrorCode.INVALID_REQUEST, "'input' must not be an empty list", "input")
        for i, item in enumerate(raw):
            if not isinstance(item, str):
                raise ApiError(
                    ErrorCode.INVALID_REQUEST, f"'input[{i}]' must be a string, got {_json_type(item)}", "input"
                )
        texts = raw
    else:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'input' must be a string or a list of strings, got {_json_type(raw)}", "input")
    if len(texts) > max_inputs:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'input' has {len(texts)} items; the limit is {max_inputs}", "input")

    encoding_format = doc.get("encoding_format") or "float"
    if encoding_format not in ENCODING_FORMATS:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'encoding_format' must be 'float' or 'base64'", "encoding_format")

    dimensions = doc.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions <= 0):
        raise ApiError(ErrorCode.INVALID_REQUEST, "'dimensions' must be a positive integer", "dimensions")

    user = doc.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError(ErrorCode.INVALID_REQUEST, "'user' must be a string", "user")

    return EmbeddingsRequest(model=model, texts=texts, encoding_format=encoding_format, dimensions=dimensions)


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


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), "null"
    )
