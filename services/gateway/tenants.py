"""Tenants in the vector stores: which tables (Qdrant's collections) an API key may write with its jobs
(``POST /v1/jobs`` with ``"sink"``) and read with its searches (``POST /v1/search``).

The gateway's ``--key-tables-file`` names them, a line a key::

    # KEY TABLE[,TABLE...]; a name ending in * is a prefix
    key-of-acme   acme_*
    key-of-blue   blue_docs,blue_faq

A gateway without API keys has one tenant, which may use every table of its stores (as before keys).
With keys, an operator key (``--operator-keys``) uses every table, and any other key only those its line
names: none without a line. A table is checked by its name, the same in every store the gateway writes
into, before the store is connected to; another key's table is refused with 403, and a key cannot take
a name first to lock its owner out (the name is its owner's whoever asks first).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.http.limits import current_key
from embedfleet.shared.errors import ErrorCode


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class TableAccess:
    """The tables each key may use: ``keys_on`` (API keys configured), the operator keys, and each other
    key's names and prefixes (``grants``)."""

    def __init__(
        self, keys_on: bool = False, operators: Iterable[str] = (), grants: Mapping[str, tuple[str, ...]] | None = None
    ) -> None:
        self._keys_on = keys_on
        self._operators = frozenset(_digest(k) for k in operators)
        # by digest: the keys themselves stay with the authentication (auth.py)
        self._grants = {_digest(k): names for k, names in (grants or {}).items()}

    def of(self, key: str | None) -> tuple[str, ...] | None:
        """What ``key`` may use: its names and prefixes, or None for every table."""
        if not self._keys_on:
            return None
        if key is None:
            return ()
        digest = _digest(key)
        return None if digest in self._operators else self._grants.get(digest, ())

    def allows(self, key: str | None, table: str) -> bool:
        names = self.of(key)
        return names is None or any(table.startswith(n[:-1]) if n.endswith("*") else table == n for n in names)

    def check(self, table: str, param: str) -> None:
        """The request being handled may use ``table``; else 403 on ``param``, naming the tables it may
        use (its own only: another key's are never told)."""
        key = current_key()
        if self.allows(key, table):
            return
        names = self.of(key) or ()
        raise ApiError(
            ErrorCode.FORBIDDEN,
            f"this API key may not use table {table!r}; "
            + (
                f"its tables: {', '.join(names)}"
                if names
                else "it may use none (the gateway's --key-tables-file names each key's)"
            ),
            param,
        )
