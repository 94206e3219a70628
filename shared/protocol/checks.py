"""Field checks for decoding untrusted protocol messages (see shared.protocol)."""

from __future__ import annotations

from typing import Any

import numpy as np

TOKEN_DTYPE = np.dtype("<i4")  # token IDs on the wire: little-endian int32


class ProtocolError(ValueError):
    """A message that is not valid protocol v1."""



def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _req(m: dict, key: str, typ: type) -> Any:
    value = m.get(key)
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ProtocolError(f"field {key!r} must be {typ.__name__}")
    return value


def _req_int(m: dict, key: str) -> int:
    value = _req(m, key, int)
    if value < 0:
        raise ProtocolError(f"field {key!r} must not be negative")
    return value


def _req_number(m: dict, key: str) -> float:
    value = m.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"field {key!r} must be a number")
    return float(value)


def _int32_array(buf: bytes, name: str) -> np.ndarray:
    if len(buf) % TOKEN_DTYPE.itemsize:
        raise ProtocolError(f"{name} is not a whole number of int32 values")
    return np.frombuffer(buf, dtype=TOKEN_DTYPE)


def _opt_bool(m: dict, key: str, default: bool) -> bool:
    value = m.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ProtocolError(f"field {key!r} must be true or false")
    return value


def _str_list(m: dict, key: str) -> list[str]:
    values = _req(m, key, list)
    if not all(isinstance(t, str) for t in values):
        raise ProtocolError("texts must be strings")
    return values


def _timings(m: dict) -> dict[str, float]:
    raw = m.get("tm") or {}
    if not isinstance(raw, dict) or len(raw) > 8:
        raise ProtocolError("timings must be a small map")
    out = {}
    for k, v in raw.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ProtocolError("timings map stage names to seconds")
        out[k] = float(v)
    return out
