"""Optional API keys: ``Authorization: Bearer <key>``, compared in constant time."""

from __future__ import annotations

import hmac


class ApiKeys:
    def __init__(self, keys: tuple[str, ...], open_paths: tuple[str, ...]) -> None:
        self._keys = [k.encode() for k in keys]
        self._open = frozenset(open_paths)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def allows(self, path: str, authorization: str | None) -> bool:
        if not self._keys or path in self._open:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        given = token.strip().encode()
        # every key is compared, whatever matched: the time taken does not tell which key is close
        ok = False
        for key in self._keys:
            ok |= hmac.compare_digest(given, key)
        return ok
