"""The guard of the local PostgreSQL (services/up/pgvector.py): ``python -m embedfleet.services.up.pgvector_guard
DATA_FOLDER``, a child of `up` that stops the postgres of DATA_FOLDER when `up` ends, however it ends.

pg_ctl starts postgres in a session of its own whose parent is not `up`: neither Ctrl-C nor the
kernel's parent-death signal (shared/parent_death.py) reaches it. The guard waits on its stdin, a pipe
whose other end only `up` holds: `up` closes it when it stops, and the kernel closes it when `up` dies
(killed outright, on every platform; a guard started as `up` dies reads its end at once); SIGTERM does
the same. Then it stops the postmaster named by the folder's postmaster.pid with postgres's fast shutdown (SIGINT:
clients cut, a checkpoint, exit). It is started before postgres is: where `up` dies while pg_ctl still
starts postgres, the guard waits for that pg_ctl to end, then stops what it started.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from pathlib import Path

STOP_TIMEOUT = 30.0  # seconds postgres may take to shut down before it is killed
START_TIMEOUT = 15.0  # seconds a pg_ctl start may take (pgserver gives it 10)


def alive(process) -> bool:
    """Whether a psutil Process still runs (a zombie does not)."""
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def postmaster_of(folder: Path):
    """The live postmaster of the data folder ``folder`` (a psutil Process), or None: the pid its
    postmaster.pid names, if that process is a postgres of this folder (a stale file's pid may be another's)."""
    import psutil

    try:
        process = psutil.Process(int((folder / "postmaster.pid").read_text().split()[0]))
        return process if str(folder) in process.cmdline() and alive(process) else None
    except (OSError, ValueError, IndexError, psutil.Error):
        return None


def stop_postmaster(process, timeout: float = STOP_TIMEOUT) -> None:
    """Stop postgres by its fast shutdown; killed if it takes over ``timeout`` seconds."""
    import psutil

    try:
        process.send_signal(signal.SIGINT)  # psutil checks the pid is still that process
        process.wait(timeout)
    except psutil.TimeoutExpired:
        process.kill()
    except psutil.NoSuchProcess:
        pass


def _starting(folder: Path) -> bool:
    """Whether a pg_ctl runs on ``folder`` (starting its postgres)."""
    import psutil

    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info["cmdline"] or []
        if cmdline and Path(cmdline[0]).name == "pg_ctl" and str(folder) in cmdline:
            return True
    return False


def _wait_for_the_end() -> None:
    """Return once stdin is at its end or SIGTERM came. The handler only notes the signal (one that
    raised could strike after the wait, anywhere: a guard dead before it stopped postgres)."""
    term: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _: term.append(signum))
    fd = sys.stdin.fileno()
    while not term:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready and not os.read(fd, 4096):
            return


def guard(folder: Path) -> int:
    """Wait for EOF on stdin (or SIGTERM), then stop the postgres of ``folder``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches up's whole group: up says when
    _wait_for_the_end()
    deadline = time.monotonic() + START_TIMEOUT
    while (postmaster := postmaster_of(folder)) is None and _starting(folder) and time.monotonic() < deadline:
        time.sleep(0.1)
    if postmaster is not None:
        stop_postmaster(postmaster)
    return 0


if __name__ == "__main__":
    sys.exit(guard(Path(sys.argv[1])))
