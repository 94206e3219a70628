"""One `embedfleet up` a data folder: a second one on the same folder would start a second nats-server
on the same JetStream store. The first holds an advisory lock (flock) on ``<data dir>/up.lock`` for
its whole life; the kernel lets go of the lock when the process dies, however it dies, so a lock is
never left stale.

The file is its owner's alone (mode 0600) and holds no secret: the holder's pid and when it started,
nothing of its command line (which may carry ``--api-keys``). A second `up` names the holder by its
pid and its command line as /proc shows it, the values of secret options hidden. The holder removes
the file as it lets go (a process killed leaves it, holding no lock, for the next one to take).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import IO

from embedfleet.shared.config.option import ConfigError

LOCK_FILE = "up.lock"
HIDDEN = "***"  # a secret option's value in a command line shown


def command_line(pid: int) -> str:
    """The command line of ``pid`` (empty where it cannot be read), each secret option's value (an API
    key, a NATS password: options whose value --help never shows) replaced by ``***``."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    args = raw.decode(errors="replace").split("\0")
    return " ".join(hide_secrets([a for a in args if a])).strip()


def hide_secrets(args: list[str]) -> list[str]:
    """``args`` with the value of each secret option (``--api-keys K`` and ``--api-keys=K``) hidden."""
    from embedfleet.shared.config.registry import OPTIONS

    secret = {o.flag for o in OPTIONS if not o.shows_value and not o.env_only}
    shown: list[str] = []
    hide_next = False
    for arg in args:
        flag, eq, _ = arg.partition("=")
        if hide_next:
            shown.append(HIDDEN)
        elif eq and flag in secret:
            shown.append(f"{flag}={HIDDEN}")
        else:
            shown.append(arg)
        hide_next = not hide_next and arg in secret
    return shown


class DataDirLock:
    """The lock on a data folder, held until ``close()`` (which removes its file)."""

    def __init__(self, path: Path, handle: IO[str]) -> None:
        self.path = path
        self._handle = handle

    def close(self) -> None:
        """Let go: the file is removed first, while the lock is still held (a second `up` that opened it
        meanwhile finds it gone once it has the lock, and takes a new one: see ``hold_data_dir``)."""
        if self._handle.closed:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            self._handle.close()


def hold_data_dir(data_dir: Path) -> DataDirLock:
    """Lock ``data_dir`` for this process; keep the returned lock as long as it is wanted.

    Raises ConfigError naming the process that holds it already, or why the folder cannot be made or
    written (read-only, not this user's, a file in its place)."""
    path = data_dir / LOCK_FILE
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unusable(data_dir, exc) from None
    while True:
        handle = _open(data_dir, path)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = _holder(handle.read())
            handle.close()
            raise ConfigError(
                f"the data folder {data_dir} is in use by {holder} (lock {path}): stop that one "
                "first, or give this one another --data-dir"
            ) from None
        if _same_file(handle, path):
            break
        handle.close()  # the holder removed it as it let go, after this opened it: a new file, locked anew
    try:
        os.fchmod(handle.fileno(), 0o600)  # a file left by an older `up` may have been readable by all
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} started {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
        handle.flush()
    except OSError as exc:  # a full disk, or a file this user may append to but not rewrite
        handle.close()
        raise _unusable(data_dir, exc) from None
    return DataDirLock(path, handle)


def _open(data_dir: Path, path: Path) -> IO[str]:
    """The lock file, made for its owner alone; not truncated before the lock is ours (it names the holder)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise _unusable(data_dir, exc) from None
    return os.fdopen(fd, "r+")


def _same_file(handle: IO[str], path: Path) -> bool:
    try:
        on_disk = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(handle.fileno())
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _holder(written: str) -> str:
    """The holder its file names ("pid N started T"), with its command line where /proc shows it."""
    words = written.split()
    if len(words) != 4 or words[0] != "pid" or not words[1].isdigit() or words[2] != "started":
        return written.strip() or "a process that has not written its pid yet"
    shown = command_line(int(words[1]))
    return f"pid {words[1]} ({shown + ', ' if shown else ''}started {words[3]})"


def _unusable(data_dir: Path, exc: OSError) -> ConfigError:
    """The error of a data folder that cannot be made or written, naming it and the cause."""
    if data_dir.exists() and not data_dir.is_dir():
        cause = "a file is in its place"
    else:
        cause = f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
    return ConfigError(
        f"the data folder {data_dir} cannot be used: {cause}; give --data-dir a folder this user can write"
    )
