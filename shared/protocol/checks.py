"""Field checks for decoding untrusted protocol messages (see embedfleet.shared.protocol)."""

from __future__ import annotations

import math
from typing import Any, TypeGuard

import numpy as np

TOKEN_DTYPE = np.dtype("<i4")  # token IDs on the wire: little-endian int32

MAX_ID = 4096  # longest request id: every reply that echoes one stays small
# longest model, job or worker name: each becomes a subject token, and a subject must fit NATS's 4 KB
# control line (the server closes a connection that sends a longer one)
MAX_NAME = 1024
MAX_ROWS = 1 << 20  # inputs (rows) in one request
MAX_BUNDLE = 1024  # requests in one Requests message
MAX_PROMPT_TOKENS = 1 << 20  # a row's leading tokens that pooling skips
MAX_IMAGE_SIDE = 4096  # prepared images' height and width (processors make a few hundred pixels)
MAX_IMAGE_TOKENS = 1 << 16  # the tokens one image's tower runs (patches + class token)
MAX_PATCH_BYTES = 3 * 32 * 32  # a page model's patch row: channels x patch x patch (ColQwen2: 3 x 14 x 14)
MAX_STAGES, MAX_STAGE_NAME = 8, 64  # timings: entries, and characters in a stage's name
# a request's cancel key (EmbedRequest.cancel_key): at least 128 random bits, so that it cannot be guessed
MIN_CANCEL_KEY, MAX_CANCEL_KEY = 16, 64
MAX_AVOID = 64  # workers one request may ask the tokenizer to pass over (EmbedRequest.avoid)


class ProtocolError(ValueError):
    """A message that is not valid protocol (see docs/protocol.md)."""


def is_int(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def required(m: dict, key: str, typ: type) -> Any:
    value = m.get(key)
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ProtocolError(f"field {key!r} must be {typ.__name__}")
    return value


def checked_id(m: dict, key: str = "id", limit: int = MAX_ID) -> str:
    value = required(m, key, str)
    if len(value) > limit:
        raise ProtocolError(f"field {key!r} is longer than {limit} characters")
    return value


def checked_name(m: dict, key: str, limit: int = MAX_NAME) -> str:
    """A name that goes into subjects (model, job, worker): not empty, at most ``limit`` characters."""
    value = checked_id(m, key, limit)
    if not value:
        raise ProtocolError(f"field {key!r} must not be empty")
    return value


def required_int(m: dict, key: str) -> int:
    value = required(m, key, int)
    if value < 0:
        raise ProtocolError(f"field {key!r} must not be negative")
    return value


def required_number(m: dict, key: str) -> float:
    value = m.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProtocolError(f"field {key!r} must be a number, and finite")
    return float(value)


def optional_number(m: dict, key: str, default: float) -> float:
    return default if m.get(key) is None else required_number(m, key)


def int32_array(buf: bytes, name: str) -> np.ndarray:
    if len(buf) % TOKEN_DTYPE.itemsize:
        raise ProtocolError(f"{name} is not a whole number of int32 values")
    return np.frombuffer(buf, dtype=TOKEN_DTYPE)


def cancel_key(m: dict, key: str = "cx") -> bytes:
    value = required(m, key, bytes)
    if not MIN_CANCEL_KEY <= len(value) <= MAX_CANCEL_KEY:
        raise ProtocolError(f"field {key!r} must hold {MIN_CANCEL_KEY} to {MAX_CANCEL_KEY} bytes")
    return value


def optional_cancel_key(m: dict) -> bytes | None:
    return None if m.get("cx") is None else cancel_key(m)


def optional_bool(m: dict, key: str, default: bool) -> bool:
    value = m.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ProtocolError(f"field {key!r} must be true or false")
    return value


def str_list(m: dict, key: str) -> list[str]:
    values = required(m, key, list)
    if len(values) > MAX_ROWS:
        raise ProtocolError(f"more than {MAX_ROWS} entries in {key!r}")
    if not all(isinstance(t, str) for t in values):
        raise ProtocolError("texts must be strings")
    return values


def name_tuple(m: dict, key: str, limit: int) -> tuple[str, ...]:
    """An optional list of at most ``limit`` names (worker ids: not empty, at most MAX_NAME characters)."""
    values = m.get(key)
    if values is None:
        return ()
    if not isinstance(values, list) or len(values) > limit:
        raise ProtocolError(f"field {key!r} must be a list of at most {limit} names")
    if not all(isinstance(v, str) and 0 < len(v) <= MAX_NAME for v in values):
        raise ProtocolError(f"field {key!r} must hold names of 1 to {MAX_NAME} characters")
    return tuple(values)


def image_files(m: dict, key: str = "im") -> list[bytes]:
    """Image files (``im``): at most ``MAX_ROWS`` non-empty byte strings; decoding them is the tokenizer's."""
    values = required(m, key, list)
    if len(values) > MAX_ROWS or not all(isinstance(i, bytes) and i for i in values):
        raise ProtocolError(f"images must be at most {MAX_ROWS} non-empty byte strings (the files)")
    return values


def timings_field(m: dict) -> dict[str, float]:
    raw = m.get("tm") or {}
    if not isinstance(raw, dict) or len(raw) > MAX_STAGES:
        raise ProtocolError("timings must be a small map")
    out = {}
    for k, v in raw.items():
        if (
            not isinstance(k, str)
            or len(k) > MAX_STAGE_NAME
            or isinstance(v, bool)
            or not isinstance(v, (int, float))
            or not math.isfinite(v)
        ):
            raise ProtocolError("timings map stage names to seconds")
        out[k] = float(v)
    return out
