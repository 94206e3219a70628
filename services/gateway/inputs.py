"""Request-body helpers the typed routes share: inputs as texts or token IDs within the gateway's limits, a
body's model read apart (POST / picks its task first), JSON types named in messages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.images.decode import ImageLimits

MAX_TOKEN_ID = (1 << 31) - 1
MAX_NAME_CHARS = 256  # a prompt name on the wire (EmbedOptions)


@dataclass(frozen=True, slots=True)
class Limits:
    max_inputs: int
    max_input_chars: int
    images: ImageLimits = field(
        default_factory=ImageLimits
    )  # one image's file and declared pixels (--max-image-bytes, --max-image-pixels)


@dataclass(frozen=True, slots=True)
class Inputs:
    texts: list[str]  # empty when the inputs are token IDs or images
    token_ids: list[np.ndarray] | None
    images: list[bytes] | None = None  # image files (their headers checked: gateway/images.py)

    @property
    def count(self) -> int:
        if self.images is not None:
            return len(self.images)
        return len(self.token_ids) if self.token_ids is not None else len(self.texts)


def json_object(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ApiError(ErrorCode.INVALID_REQUEST, "request body must be a JSON object")
    return doc


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
    within_count(inputs.count, param, limits)
    return inputs


def within_count(count: int, param: str, limits: Limits) -> None:
    """A request's ``count`` inputs (of any kind) once they are not too many."""
    if count > limits.max_inputs:
        raise ApiError(
            ErrorCode.TOO_MANY_INPUTS, f"'{param}' has {count} items; the limit is {limits.max_inputs}", param
        )


def within_document_chars(docs: Sequence[tuple[str, object]], max_chars: int) -> None:
    """A bulk job's documents (id, text) once none has more than ``max_chars`` characters (the gateway's
    --max-document-chars): else 413 naming the first that has, before anything is published. An image
    document has no characters (its file is held to --max-image-bytes)."""
    for i, (doc_id, text) in enumerate(docs):
        if isinstance(text, str) and len(text) > max_chars:
            raise ApiError(
                ErrorCode.INPUT_TOO_LONG,
                f"document {i} ({doc_id[:200]!r}) has {len(text)} characters; the limit is {max_chars} "
                "(the gateway's --max-document-chars): cut it into shorter documents",
                "documents",
            )


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


_names = {str: "a string", bool: "a boolean", int: "an integer", list: "a list", dict: "an object"}


def json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), "null"
    )
