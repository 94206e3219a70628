"""A PostgreSQL with pgvector beside the local stack (``embedfleet up --with-pgvector``), from the PyPI
package pgserver, which ships both (the extra ``local-pgvector``).

Its data lives in ``<data dir>/pgvector``; it listens on a unix socket in that folder only (no TCP
port), which only the folder's owner reaches, and trusts whoever reaches it. Its URL names the socket's
folder with libpq's ``host=`` parameter: ``postgresql://postgres@/postgres?host=/abs/path``.

pg_ctl starts postgres in a session of its own whose parent is not `up`: a guard, a child of `up`
(services/up/pgvector_guard.py), stops it when `up` ends, however it ends.
"""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
import time
import warnings
from pathlib import Path
from urllib.parse import quote

from embedfleet.services.up.pgvector_guard import STOP_TIMEOUT, alive, postmaster_of, stop_postmaster
from embedfleet.shared.config.option import ConfigError

FOLDER = "pgvector"  # under the data dir
TABLE = "documents"  # the table the gateway searches, unless --search-sink names another store
REAP_TIMEOUT = 10.0  # seconds a dead postmaster may stay a zombie (its parent, init, reaps it) before a restart
_INSTALL = (
    "run `make run ARGS=--with-pgvector` (it installs them), or in the checkout "
    f"`{sys.executable} -m pip install -e '.[local-pgvector]'`"
)


class LocalPgvector:
    """The PostgreSQL of one `up`: ``start()`` (again after it died), ``url``, ``running``, ``stop()``."""

    def __init__(self, data_dir: Path) -> None:
        self.folder = (data_dir / FOLDER).resolve()
        self.url = ""
        self._postmaster = None  # psutil.Process
        self._guard: subprocess.Popen | None = None

    def start(self) -> str:
        """Start PostgreSQL (make its data folder the first time) and its guard; its URL. ConfigError
        when pgserver is missing, the folder unusable or postgres fails to start (its log's end said)."""
        dead = self._postmaster
        self.stop()  # a dead one's guard
        if dead is not None:  # a postmaster.pid naming a zombie reads as a server running, to pgserver and postgres
            _reaped(dead, REAP_TIMEOUT)
        pgserver = require_pgserver()
        _check_folder(self.folder)
        # the guard first: this process killed while postgres starts leaves none behind either. No
        # parent-death signal: a guard started as this process dies must still do its work
        self._guard = subprocess.Popen(
            [sys.executable, "-m", "embedfleet.services.up.pgvector_guard", str(self.folder)], stdin=subprocess.PIPE
        )
        logging.getLogger("pgserver").setLevel(logging.CRITICAL)  # its failures are told below, with the log
        try:
            # not get_server: it hands back the instance it made before, dead server and all, once one died;
            # cleanup_mode None: stopped by the guard, not at this process's exit
            server = pgserver.PostgresServer(self.folder, cleanup_mode=None)
            info = server.get_postmaster_info()
        except (OSError, subprocess.SubprocessError, RuntimeError, AssertionError) as exc:
            self.stop()
            raise ConfigError(
                f"--with-pgvector: PostgreSQL did not start in {self.folder}: {exc or type(exc).__name__}"
                f"{_log_end(self.folder)}"
            ) from None
        self._postmaster = info.process
        self.url = f"postgresql://postgres@/postgres?host={quote(str(info.socket_dir))}"
        return self.url

    @property
    def running(self) -> bool:
        return self._postmaster is not None and alive(self._postmaster)

    def stop(self) -> None:
        """Stop PostgreSQL (its guard does, as when `up` dies) and wait for it; idempotent."""
        guard, self._guard = self._guard, None
        if guard is not None:
            if guard.stdin is not None:  # started with a pipe: always
                guard.stdin.close()  # the guard reads EOF
            try:
                guard.wait(STOP_TIMEOUT + 10)
            except subprocess.TimeoutExpired:
                guard.kill()
                guard.wait()
        left = postmaster_of(self.folder)
        if left is not None:  # the guard died first
            stop_postmaster(left)
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
        raise ConfigError(
            f"--with-pgvector needs the packages pgserver, psycopg and pgvector (the extra "
            f"local-pgvector), missing here ({exc}): {_INSTALL}"
        ) from None
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
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            problem = f"cannot be made ({exc.strerror or exc})"
    if problem:
        raise ConfigError(
            f"--with-pgvector: {folder} {problem}: PostgreSQL keeps its data there; move it away, "
            "or start up with another --data-dir"
        )


def _reaped(process, timeout: float) -> None:
    """Wait, at most ``timeout`` seconds, until the dead ``process`` (a psutil Process) is gone altogether."""
    deadline = time.monotonic() + timeout
    while process.is_running() and time.monotonic() < deadline:
        time.sleep(0.05)


def _log_end(folder: Path, lines: int = 10) -> str:
    try:
        tail = (folder / "log").read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return f"; the end of its log {folder / 'log'}:\n" + "\n".join(tail) if tail else ""
