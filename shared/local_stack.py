"""Where the local stack `embedfleet up` runs, recorded in its data folder for the one-shot commands.

`up` picks a free port for its embedded nats-server and makes a new token at every start. Once the
server answers it writes ``<data dir>/stack.json`` (atomically: a reader sees the whole record or
none) with the server's URL, the token file and its own pid, and removes it when it stops.
``reindex``, ``jobs`` and ``init`` read it when they are given no NATS URL and no credentials, so
the commands the README shows find the stack without copying a port or a token after a restart.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from embedfleet.shared.config import NATS_SECURITY_ENV, ConfigError
from embedfleet.shared.options import PASSWORD_ENV, TOKEN_ENV

RECORD = "stack.json"
FALLBACK_URL = "nats://127.0.0.1:4222"  # no URL given and no stack recorded


@dataclass(frozen=True, slots=True)
class LocalStack:
    """A running `up`: its NATS URL (no credentials), the file holding the token NATS asks for, its pid."""

    url: str
    token_file: str | None
    pid: int

    def write(self, data_dir: Path) -> Path:
        """Write the record into ``data_dir`` atomically (a temporary file renamed over it); its path."""
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / RECORD
        fd, tmp = tempfile.mkstemp(dir=data_dir, prefix=".stack-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"url": self.url, "token_file": self.token_file, "pid": self.pid}, f)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


def record_stack(data_dir: str | Path, url: str, token_file: Path | None) -> Path:
    """Record this process's stack (NATS at ``url``, its token in ``token_file``) in ``data_dir``."""
    return LocalStack(url, str(Path(token_file).resolve()) if token_file else None, os.getpid()).write(Path(data_dir))


def forget_stack(data_dir: str | Path) -> None:
    """Remove the record of this process's stack (one another `up` wrote since stays)."""
    found = read_stack(Path(data_dir))
    if found is not None and found.pid == os.getpid():
        (Path(data_dir) / RECORD).unlink(missing_ok=True)


def read_stack(data_dir: Path) -> LocalStack | None:
    """The stack recorded in ``data_dir``; None when there is none, or its `up` no longer runs (killed
    before it could remove the record)."""
    try:
        raw = json.loads((data_dir / RECORD).read_text())
        stack = LocalStack(str(raw["url"]), raw.get("token_file"), int(raw["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return stack if _alive(stack.pid) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True


def nats_given(ns: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether a NATS URL or any NATS credential is given. The flags' defaults come from their
    environment variables already; the secrets themselves only travel in the environment."""
    return (
        getattr(ns, "nats", None) is not None
        or any(getattr(ns, dest, None) for dest in NATS_SECURITY_ENV)
        or any(environ.get(name) for name in (PASSWORD_ENV, TOKEN_ENV))
    )


def use_local_stack(ns: argparse.Namespace) -> str:
    """Give ``ns`` the URL and token file of the stack recorded in ``--data-dir`` when no NATS URL or
    credential is given (else the default URL); returns where the URL came from, for errors."""
    if nats_given(ns):
        ns.nats = ns.nats or FALLBACK_URL  # credentials without a URL: the default server
        return "given by --nats or the environment" if ns.nats != FALLBACK_URL else "the default"
    record = Path(ns.data_dir) / RECORD
    stack = read_stack(Path(ns.data_dir))
    if stack is None:
        ns.nats = FALLBACK_URL
        return f"the default, as no running `embedfleet up` is recorded in {record}"
    if stack.token_file and not Path(stack.token_file).is_file():
        raise ConfigError(
            f"{record} names the token file {stack.token_file}, which is not there: start "
            "`embedfleet up` again, or give --nats and its credentials"
        )
    ns.nats, ns.nats_token_file = stack.url, stack.token_file
    return f"recorded in {record} by `embedfleet up` (pid {stack.pid})"
