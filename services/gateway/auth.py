"""Optional API keys: ``Authorization: Bearer <key>``, compared in constant time."""

from __future__ import annotations

import hmac


class ApiKeys:
    def __init__(self, keys: tuple[str, ...], open_paths: tuple[str, ...]) -> None:
        self._keys = [k.encode() for k in keys]
        self._open = frozenset(open_paths)

    @property
    def open_paths(self) -> frozenset[str]:
        return self._open

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def identify(self, authorization: str | None) -> str | None:
        """The configured key an ``Authorization: Bearer`` header gives; None for none or another."""
        scheme, _, token = (authorization or "").partition(" ")
        if not self._keys or scheme.lower() != "bearer":
            return None
        given = token.strip().encode()
        # every key is compared, whatever matched: the time taken does not tell which key is close
        found = None
        for key in self._keys:
            if hmac.compare_digest(given, key):
                found = key
        return found.decode() if found is not None else None
