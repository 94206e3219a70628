"""``--key-tables-file``: the tables (Qdrant's collections) each API key may use, read when the gateway's
configuration is made (services/gateway/tenants.py applies them to requests)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from embedfleet.shared.config.option import ConfigError

# a table as the file names it: what every store's names share (letters, digits, _ and -), or a prefix of them
_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,62}\*?$|^\*$")


def read_key_tables(path: Path, keys: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """``--key-tables-file``'s lines: key -> the table names (and prefixes, ``name*``) it may use.
    ConfigError naming the line for a key not among the gateway's ``keys``, a key given twice, or a name
    that is not one."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"--key-tables-file {path}: {exc.strerror}") from None
    known = set(keys)
    tables: dict[str, tuple[str, ...]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, listed = line.replace("\t", " ").partition(" ")
        names = tuple(n.strip() for n in listed.split(",") if n.strip())
        where = f"--key-tables-file {path}, line {number}"
        if key not in known:
            raise ConfigError(f"{where}: the key is none of the gateway's API keys (--api-keys, --api-keys-file)")
        if key in tables:
            raise ConfigError(f"{where}: the key has a line already")
        if not names:
            raise ConfigError(f"{where}: name the key's tables after it: KEY TABLE[,TABLE...]")
        if bad := [n for n in names if not _PATTERN.match(n)]:
            raise ConfigError(
                f"{where}: {bad[0]!r} is not a table name (letters, digits, _ -), or a prefix of one ending in *"
            )
        tables[key] = names
    return tables
