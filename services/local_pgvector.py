"""A PostgreSQL with pgvector beside the local stack (``embedfleet up --with-pgvector``), from the PyPI
package pgserver, which ships both (the extra ``local-pgvector``).

Its data lives in ``<data dir>/pgvector``; it listens on a unix socket in that folder only (no TCP
port), which only the folder's owner reaches, and trusts whoever reaches it. Its URL names the socket's
folder with libpq's ``host=`` parameter: ``postgresql://postgres@/postgres?host=/abs/path``.

pg_ctl starts postgres in a session of its own whose parent is not `up`: neither Ctrl-C nor the
kernel's parent-death signal (shared/parent_death.py) reaches it. A guard does: a small child of `up`
(``python -m services.local_pgvector PID``) that waits on a pipe whose other end only `up` holds. When
`up` closes it (stopping, however it stops) or dies (killed outright: the kernel closes a dead
process's files, on every platform), or the guard gets SIGTERM (on Linux, also sent when `up` dies),
the guard stops postgres with its fast shutdown (SIGINT: clients cut, a checkpoint, exit) and ends.
"""

from __future__ import annotations

import importlib
import logging
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from urllib.parse import quote

from shared.option import ConfigError
from shared.parent_death import die_with_parent

log = logging.getLogger("embedfleet.up")

FOLDER = "pgvector"  # under the data dir
TABLE = "documents"  # the table the gateway searches, unless --search-sink names another store
STOP_TIMEOUT = 30.0  # seconds postgres may take to shut down before it is killed
_INSTALL = ("run `make run ARGS=--with-pgvector` (it installs them), or in the checkout "
            f"`{sys.executable} -m pip install -e '.[local-pgvector]'`")


class LocalPgvector:
    """The PostgreSQL of one `up`: ``start()`` (again after it died), ``url``, ``running``, ``stop()``."""

    def __init__(self, data_dir: Path) -> None:
        self.folder = (data_dir / FOLDER).absolute()
        self.url = ""
        self._postmaster = None  # psutil.Process
        self._guard: subprocess.Popen | None = None

    def start(self) -> str:
        """Start PostgreSQL (make its data folder the first time) and its guard; its URL. ConfigError
        when pgserver is missing, the folder unusable or postgres fails to start (its log's end said)."""
        self.stop()  # a dead one's guard
        pgserver = require_pgserver()
        _check_folder(self.folder)
        logging.getLogger("pgserver").setLevel(logging.CRITICAL)  # its failures are told below, with the log
        try:
            server = pgserver.get_server(self.folder, cleanup_mode=None)  # None: stopped by the guard, not at exit
            info = server.get_postmaster_info()
        except (OSError, subprocess.SubprocessError, RuntimeError, AssertionError) as exc:
            raise ConfigError(f"--with-pgvector: PostgreSQL did not start in {self.folder}: {exc}"
                              f"{_log_end(self.folder)}") from None
        self._postmaster = info.process
        # the guard: a child of this thread (the main one, as shared/parent_death.py wants)
        self._guard = subprocess.Popen([sys.executable, "-m", "services.local_pgvector", str(info.pid)],
                                       stdin=subprocess.PIPE, preexec_fn=die_with_parent())
        self.url = f"postgresql://postgres@/postgres?host={quote(str(info.socket_dir))}"
        return self.url

    @property
    def running(self) -> bool:
        return self._postmaster is not None and _alive(self._postmaster)

    def stop(self) -> None:
        """Stop PostgreSQL (its guard does, as when `up` dies) and wait for it; idempotent."""
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.stdin.close()  # the guard reads EOF
            try:
                guard.wait(STOP_TIMEOUT + 10)
            except subprocess.TimeoutExpired:
                guard.kill()
                guard.wait()
        if self._postmaster is not None and _alive(self._postmaster):  # the guard died first
            stop_postmaster(self._postmaster)
        self._postmaster = None


def require_pgserver():
    """The pgserver module, the pgvector sink's clients checked too; ConfigError saying what to install."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns where XDG_RUNTIME_DIR is unset
            import pgserver
        for client in ("psycopg", "pgvector.psycopg"):  # the pgvector sink's: reindex --sink, the gateway's search
            importlib.import_module(client)
    except ImportError as exc:
        raise ConfigError(f"--with-pgvector needs the packages pgserver, psycopg and pgvector (the extra "
                          f"local-pgvector), missing here ({exc}): {_INSTALL}") from None
    return pgserver


def _check_folder(folder: Path) -> None:
    """A folder PostgreSQL can keep its data in: none yet, an empty one, or one of its own."""
    problem = None
    if " " in str(folder):  # pg_ctl hands postgres its socket folder in one option string, split at spaces
        problem = "has a space in its path, which pgserver's PostgreSQL cannot take"
    elif folder.exists() and not folder.is_dir():
        problem = "is not a folder"
    elif folder.is_dir() and not (folder / "PG_VERSION").exists() and any(folder.iterdir()):
        problem = "holds files but no PostgreSQL data (no PG_VERSION)"
    else:
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            problem = f"cannot be made ({exc.strerror or exc})"
    if problem:
        raise ConfigError(f"--with-pgvector: {folder} {problem}: PostgreSQL keeps its data there; move it away, "
                          "or start up with another --data-dir")


def _log_end(folder: Path, lines: int = 10) -> str:
    try:
        tail = (folder / "log").read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return f"; the end of its log {folder / 'log'}:\n" + "\n".join(tail) if tail else ""


def _alive(process) -> bool:
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


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


class _Stop(Exception):
    pass


def _stop_now(*_) -> None:
    raise _Stop


def _guard(pid: int) -> int:
    """Wait for EOF on stdin (or SIGTERM), then stop the postgres of ``pid``."""
    import psutil

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches up's whole group: up says when
    signal.signal(signal.SIGTERM, _stop_now)
    try:
        postmaster = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return 0
    try:
        sys.stdin.buffer.read()
    except _Stop:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stopping already
    stop_postmaster(postmaster)
    return 0


if __name__ == "__main__":
    sys.exit(_guard(int(sys.argv[1])))
