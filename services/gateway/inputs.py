"""Request-body helpers shared by the OpenAI and TEI routes: JSON, inputs, limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from embedfleet.services.gateway.errors import ApiError
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.protocol import MAX_DIMENSION
from embedfleet.shared.vector_forms import EMBEDDING_TYPES, form_named

MAX_TOKEN_ID = (1 << 31) - 1
MAX_NAME_CHARS = 256  # a prompt name on the wire (EmbedOptions)


@dataclass(frozen=True, slots=True)
class Limits:
    max_inputs: int
    max_input_chars: int


@dataclass(frozen=True, slots=True)
class Inputs:
    texts: list[str]  # empty when the inputs are token IDs
    token_ids: list[np.ndarray] | None

    @property
    def count(self) -> int:
        return len(self.token_ids) if self.token_ids is not None else len(self.texts)


def json_object(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ApiError(ErrorCode.INVALID_REQUEST, "request body must be a JSON object")
    return doc


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
        inputs = Inputs([], [_token_list(items, param)])
    elif allow_tokens and isinstance(items[0], list):
        inputs = Inputs([], [_token_list(item, f"{param}[{i}]") for i, item in enumerate(items)])
    else:
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise ApiError(
                    ErrorCode.INVALID_REQUEST, f"'{param}[{i}]' must be a string, got {json_type(item)}", param
                )
        inputs = Inputs(items, None)
    return within_limits(inputs, param, limits)


def typed_inputs(raw: str | list[str] | list[int] | list[list[int]], param: str, limits: Limits) -> Inputs:
    """A typed body's validated inputs (a text, texts, token IDs or token-ID lists) as texts or int32
    token-ID arrays, within ``limits``."""
    if isinstance(raw, str):  # one text, the hot path: only its length to check
        if len(raw) <= limits.max_input_chars:
            return Inputs([raw], None)
        inputs = Inputs([raw], None)
    elif isinstance(raw[0], str):
        inputs = Inputs(raw, None)
    elif isinstance(raw[0], int):
        inputs = Inputs([], [np.asarray(raw, dtype=np.int32)])
    else:
        inputs = Inputs([], [np.asarray(ids, dtype=np.int32) for ids in raw])
    return within_limits(inputs, param, limits)


def within_limits(inputs: Inputs, param: str, limits: Limits) -> Inputs:
    """``inputs`` (of well-typed items) once none is too long and there are not too many."""
    for i, item in enumerate(inputs.texts):
        if len(item) > limits.max_input_chars:
            raise ApiError(
                ErrorCode.INPUT_TOO_LONG,
                f"'{param}[{i}]' has {len(item)} characters; the limit is {limits.max_input_chars}",
                param,
            )
    if inputs.count > limits.max_inputs:
        raise ApiError(
            ErrorCode.TOO_MANY_INPUTS, f"'{param}' has {inputs.count} items; the limit is {limits.max_inputs}", param
        )
    return inputs


def _token_list(value: Any, where: str) -> np.ndarray:
    if not isinstance(value, list) or not value:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, f"'{where}' must be a non-empty list of token IDs", where.split("[")[0]
        )
    for t in value:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= MAX_TOKEN_ID:
            raise not_a_token(where, t)
    return np.asarray(value, dtype=np.int32)


def not_a_token(where: str, value: Any) -> ApiError:
    """The error for ``value`` in the token-ID list at ``where`` ('input', 'input[2]')."""
    return ApiError(
        ErrorCode.INVALID_TOKENS, f"'{where}' holds {value!r}, not a token ID (an integer >= 0)", where.split("[")[0]
    )


def optional(doc: dict, key: str, kind: type, default: Any = None) -> Any:
    value = doc.get(key, default)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'{key}' must be {_names[kind]}", key)
    return value


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
    """The vector form (shared/vector_forms.py) that ``embedding_type`` names; float32 when it is absent."""
    name = optional(doc, "embedding_type", str, "float")
    try:
        return form_named(name).name
    except ValueError:
        known = ", ".join(f"'{n}'" for n in EMBEDDING_TYPES)
        raise ApiError(
            ErrorCode.INVALID_REQUEST, f"'embedding_type' must be one of {known}", "embedding_type"
        ) from None


_names = {str: "a string", bool: "a boolean", int: "an integer", list: "a list", dict: "an object"}


def json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), "null"
    )
