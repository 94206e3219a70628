"""The hand-written body parsers the gateway's routes had before their typed models (openai/body.py
and the other *_body.py), kept here as bench/body_parsing.py's baseline: orjson, then a check a field.
Nothing in the gateway uses them."""

from __future__ import annotations

from typing import Any

import numpy as np

from embedfleet.services.gateway.chunking import RETURNS, Chunking
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import (
    MAX_NAME_CHARS,
    MAX_TOKEN_ID,
    Inputs,
    Limits,
    json_type,
    not_a_token,
    optional,
    within_limits,
)
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.protocol import MAX_DIMENSION
from embedfleet.shared.text_chunks import BOUNDARIES, ChunkSpec
from embedfleet.shared.vectors.forms import EMBEDDING_TYPES, form_named

CHUNKING_KEYS = ("size", "overlap", "boundary", "late", "return")


def parse_inputs(raw: Any, param: str, limits: Limits, allow_tokens: bool) -> Inputs:
    """A string, a list of strings, or (``allow_tokens``) a list of token IDs or of token-ID lists."""
    if isinstance(raw, str):
        items: list = [raw]
    elif isinstance(raw, list):
        if not raw:
            raise ApiError(ErrorCode.INVALID_REQUEST, f"'{param}' must not be an empty list", param)
        items = raw
    else:
        kinds = "a string, a list of strings" + (
            ", a list of token IDs or a list of token-ID lists" if allow_tokens else ""
        )
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'{param}' must be {kinds}, got {json_type(raw)}", param)

    if allow_tokens and isinstance(items[0], int) and not isinstance(items[0], bool):
        inputs = Inputs([], [token_list(items, param)])
    elif allow_tokens and isinstance(items[0], list):
        inputs = Inputs([], [token_list(item, f"{param}[{i}]") for i, item in enumerate(items)])
    else:
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise ApiError(
                    ErrorCode.INVALID_REQUEST, f"'{param}[{i}]' must be a string, got {json_type(item)}", param
                )
        inputs = Inputs(items, None)
    return within_limits(inputs, param, limits)


def token_list(value: Any, where: str) -> np.ndarray:
    if not isinstance(value, list) or not value:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, f"'{where}' must be a non-empty list of token IDs", where.split("[")[0]
        )
    for t in value:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= MAX_TOKEN_ID:
            raise not_a_token(where, t)
    return np.asarray(value, dtype=np.int32)


def positive_dimensions(doc: dict, key: str = "dimensions") -> int | None:
    dims = optional(doc, key, int)
    if dims is not None and not 0 < dims <= MAX_DIMENSION:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'{key}' must be a positive integer (at most {MAX_DIMENSION})", key)
    return dims


def name_field(doc: dict, key: str) -> str | None:
    """An optional short name (a prompt's): a string of at most MAX_NAME_CHARS characters."""
    value = optional(doc, key, str)
    if value is not None and len(value) > MAX_NAME_CHARS:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, f"'{key}' is {len(value)} characters; names are at most {MAX_NAME_CHARS}", key
        )
    return value


def embedding_form(doc: dict) -> str:
    """The vector form (shared/vectors/forms.py) that ``embedding_type`` names; float32 when it is absent."""
    name = optional(doc, "embedding_type", str, "float")
    try:
        return form_named(name).name
    except ValueError:
        known = ", ".join(f"'{n}'" for n in EMBEDDING_TYPES)
        raise ApiError(
            ErrorCode.INVALID_REQUEST, f"'embedding_type' must be one of {known}", "embedding_type"
        ) from None


def parse_chunking(
    doc: dict[str, Any], param: str = "chunking", keys: tuple[str, ...] = CHUNKING_KEYS
) -> Chunking | None:
    """The request's ``chunking`` object (None when absent), of ``keys`` at most; refused in the route's
    error shape when its keys or values are wrong."""
    raw = doc.get(param)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"'{param}' must be an object with 'size' and optionally {', '.join(repr(k) for k in keys[1:])}",
            param,
        )
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"'{param}' has unknown keys {', '.join(map(repr, unknown))}: it takes {', '.join(map(repr, keys))}",
            param,
        )
    if "size" not in raw:
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"'{param}.size' is required: the most tokens of text a chunk holds",
            f"{param}.size",
        )
    late, returns = raw.get("late", False), raw.get("return", "chunks")
    if not isinstance(late, bool):
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'{param}.late' must be true or false", f"{param}.late")
    if returns not in RETURNS:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'{param}.return' must be 'chunks' or 'mean'", f"{param}.return")
    boundary = raw.get("boundary", "token")
    if not isinstance(boundary, str) or boundary not in BOUNDARIES:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, f"'{param}.boundary' must be 'token' or 'sentence'", f"{param}.boundary"
        )
    try:
        spec = ChunkSpec(raw["size"], raw.get("overlap", 0), boundary)
    except ServiceError as exc:
        raise ApiError(exc.code, exc.message, param) from None
    return Chunking(spec, late, returns)


def parse_text_chunking(doc: dict[str, Any], inputs: Inputs, field: str) -> Chunking | None:
    """``parse_chunking`` on a route whose inputs are in ``field``: inputs given as token IDs have no
    text to cut, and are refused."""
    chunking = parse_chunking(doc)
    if chunking is not None and inputs.token_ids is not None:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, f"'chunking' cuts texts: give '{field}' as text, not token IDs", "chunking"
        )
    return chunking
