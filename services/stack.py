"""``embedfleet up``: a complete local stack, one process per service, on an embedded nats-server."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from shared.config import child_environment, nats_security
from shared.lifecycle import setup_logging
from shared.model_dir import load_model_info
from shared.nats_server import EmbeddedNats

log = logging.getLogger("embedfleet.up")

READY_TIMEOUT = 180.0  # seconds: model load on a slow CPU


def run_stack(ns: argparse.Namespace) -> int:
    setup_logging(ns.log_level, "up")
    info = load_model_info(ns.model, ns.model_name)  # fail fast on a bad --model
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    # the URL without credentials (safe to print); credentials and TLS files checked before anything starts
    url, auth, tls = nats_security(ns)
    nats = None
    if url is None:
        nats = EmbeddedNats(Path(ns.data_dir) / "nats")
        url = nats.start()
    children: dict[str, subprocess.Popen] = {}
    try:
        common = ["--nats", url, "--subject-prefix", ns.subject_prefix, "--log-level", ns.log_level]
        env = child_environment(auth, tls, os.environ)  # secrets go to the services in their environment
        model_args = (["--model", str(info.path)] if ns.model else []) + ["--model-name", info.id]
        commands = {
            role: [sys.executable, "-m", "services.cli", role, *common, *extra]
            for role, extra in (
                ("tokenizer", model_args),
                ("worker", model_args),
                ("scorer", model_args),
                ("gateway", _gateway_args(ns)),
            )
        }
        for role, command in commands.items():
            children[role] = subprocess.Popen(command, env=env)
        host = "127.0.0.1" if ns.host in ("0.0.0.0", "::") else ns.host
        base = f"http://{host}:{ns.port}"
        if not _wait_ready(base, children, stop):
            return 1
        print(
            f"\nembedfleet is up: model {info.id!r}, NATS {url}\n"
            f"  POST {base}/v1/embeddings   (OpenAI API)\n"
            f"  GET  {base}/v1/models\n"
            f"  GET  {base}/health\n"
            f"  try: curl -s {base}/v1/embeddings -H 'content-type: application/json' "
            f"-d '{{\"model\": \"{info.id}\", \"input\": \"hello world\"}}'\n"
            "Ctrl-C stops everything.\n",
            flush=True,
        )
        restarts = Restarts()
        while not stop.wait(0.5):
            if nats is not None and not nats.running:
                if not restarts.allow("nats-server"):
                    return 1
                log.error("nats-server exited; starting it again")
                nats.start()
            for role, proc in children.items():
                if proc.poll() is not None and restarts.allow(role):
                    log.error("%s exited with %s; starting it again", role, proc.returncode)
                    children[role] = subprocess.Popen(commands[role], env=env)
                elif proc.poll() is not None:
                    return 1
        return 0
    finally:
        _stop_children(children)
        if nats is not None:
            nats.stop()
            log.info("nats-server stopped")


class Restarts:
    """A service that dies is started again, unless it died ``limit`` times within ``window`` seconds:
    then it cannot start (a bad option, a broken model, a port taken) and the stack stops."""

    def __init__(self, limit: int = 5, window: float = 60.0) -> None:
        self._limit = limit
        self._window = window
        self._deaths: dict[str, list[float]] = {}

    def allow(self, name: str) -> bool:
        now = time.monotonic()
        deaths = [t for t in self._deaths.get(name, []) if now - t < self._window] + [now]
        self._deaths[name] = deaths
        if len(deaths) > self._limit:
            log.error("%s died %d times within %.0fs; stopping the stack", name, len(deaths), self._window)
            return False
        return True


def _gateway_args(ns: argparse.Namespace) -> list[str]:
    """Every gateway option `up` was given, passed on to the gateway process."""
    from services.gateway import config as gateway_config

    probe = argparse.ArgumentParser(add_help=False)
    gateway_config.add_arguments(probe)
    args: list[str] = []
    for action in probe._actions:
        value = getattr(ns, action.dest, None)
        if action.option_strings and value is not None:
            args += [action.option_strings[0], str(value)]
    return args


def _wait_ready(base: str, children: dict[str, subprocess.Popen], stop: threading.Event) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline and not stop.is_set():
        for role, proc in children.items():
            if proc.poll() is not None:
                log.error("%s exited with %s during start-up", role, proc.returncode)
                return False
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.25)
    if not stop.is_set():
        log.error("the stack did not become healthy within %.0fs", READY_TIMEOUT)
    return False


def _stop_children(children: dict[str, subprocess.Popen]) -> None:
    # the gateway first (no new requests), then the fleet finishes in-flight work
    for role in ("gateway", "scorer", "tokenizer", "worker"):
        proc = children.get(role)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 40
    for role, proc in children.items():
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in time; killing it", role)
            proc.kill()
            proc.wait()
