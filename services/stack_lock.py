"""One `embedfleet up` a data folder: a second one on the same folder would start a second nats-server
on the same JetStream store. The first holds an advisory lock (flock) on ``<data dir>/up.lock`` for
its whole life, with its pid and command line in the file; the kernel lets go of the lock when the
process dies, however it dies, so a lock is never left stale."""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path
from typing import IO

from embedfleet.shared.config import ConfigError

LOCK_FILE = "up.lock"


def command_line(pid: int) -> str:
    """The command line of ``pid`` (empty where it cannot be read)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def hold_data_dir(data_dir: Path) -> IO[str]:
    """Lock ``data_dir`` for this process; keep the returned file open as long as the lock is wanted.

    Raises ConfigError naming the process that holds it already, or why the folder cannot be made or
    written (read-only, not this user's, a file in its place)."""
    path = data_dir / LOCK_FILE
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+")  # noqa: SIM115 (returned, held open as the lock) not truncated before the lock is ours: it names the holder
    except OSError as exc:
        raise _unusable(data_dir, exc) from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "a process that has not written its pid yet"
        handle.close()
        raise ConfigError(
            f"the data folder {data_dir} is in use by {holder} (lock {path}): stop that one "
            "first, or give this one another --data-dir"
        ) from None
    pid = os.getpid()
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {pid} ({command_line(pid) or ' '.join(sys.argv)})\n")
        handle.flush()
    except OSError as exc:  # a full disk, or a file this user may append to but not rewrite
        handle.close()
        raise _unusable(data_dir, exc) from None
    return handle


def _unusable(data_dir: Path, exc: OSError) -> ConfigError:
    """The error of a data folder that cannot be made or written, naming it and the cause."""
    if data_dir.exists() and not data_dir.is_dir():
        cause = "a file is in its place"
    else:
        cause = f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
    return ConfigError(
        f"the data folder {data_dir} cannot be used: {cause}; give --data-dir a folder this user can write"
    )
