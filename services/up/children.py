"""The processes `embedfleet up` runs, and its one rule for a death, from the first process started to
the stop.

A process that has been ready once (its ready file written) serves users, or soon will: its death is
supervised, whenever it comes, the start-up included (a worker killed by the OOM killer while `up`
still waits for another model's worker): started again, unless it died ``--restart-limit`` times
within ``--restart-window`` seconds. So is a process killed by a signal before it was ever ready
(nothing says it cannot start). Only a process that exits by itself before it was ever ready is a
failed start: a bad option, a model it cannot load, a port taken, which starting it again would not mend.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from embedfleet.services.up.pgvector import LocalPgvector
from embedfleet.services.up.plan import Child
from embedfleet.shared.config.registry import declared, default
from embedfleet.shared.nats.server import EmbeddedNats
from embedfleet.shared.parent_death import die_with_parent

log = logging.getLogger("embedfleet.up")


class Fleet:
    """The stack's processes, by child name."""

    def __init__(self, env: dict[str, str]) -> None:
        # the children take their model from their arguments, never from the variables `up` read
        models = {name for o in declared("up", ["model"]) for name in o.env}
        self.env = {k: v for k, v in env.items() if k not in models}
        self._procs: dict[str, subprocess.Popen] = {}
        self._roles: dict[str, str] = {}
        self._was_ready: set[str] = set()

    def start(self, child: Child) -> None:
        child.ready.unlink(missing_ok=True)  # a killed process leaves its file behind
        self._roles[child.name] = child.role
        self._procs[child.name] = subprocess.Popen(
            [sys.executable, "-m", "embedfleet.services.cli", child.role, *child.args],
            env=self.env,
            preexec_fn=die_with_parent(),
        )

    def started(self, child: Child) -> bool:
        return child.name in self._procs

    def ready(self, child: Child) -> bool:
        """Whether ``child`` is ready now (its ready file is there); remembered for ``was_ready``."""
        if child.ready.exists():
            self._was_ready.add(child.name)
            return True
        return False

    def was_ready(self, child: Child) -> bool:
        """Whether any process of ``child`` has been ready (a dead one's file is there until it starts again)."""
        return self.ready(child) or child.name in self._was_ready

    def exited(self, child: Child) -> int | None:
        """The exit status of a started child that has stopped; None while it runs (or before it starts)."""
        proc = self._procs.get(child.name)
        return None if proc is None else proc.poll()

    def stop_all(self) -> None:
        # the gateway first (no new requests), then the fleet finishes in-flight work
        for role in ("gateway", "scorer", "tokenizer", "worker"):
            for name, proc in self._procs.items():
                if self._roles[name] == role and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 40
        for name, proc in self._procs.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time; killing it", name)
                proc.kill()
                proc.wait()


class Restarts:
    """A service that dies is started again, unless it died ``limit`` times within ``window`` seconds:
    then it cannot start (a bad option, a broken model, a port taken) and the stack stops."""

    def __init__(self, limit: int = default("restart_limit"), window: float = default("restart_window")) -> None:
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


@dataclass
class Supervisor:
    """Looks after the stack's processes: ``plan`` in ``fleet``, and the nats-server and PostgreSQL
    `up` started (None: none). ``why(child, code)`` adds the cause of a failed start it can tell
    (': port 8080 on ... is in use by ...'), or ''."""

    plan: Sequence[Child]
    fleet: Fleet
    restarts: Restarts
    nats: EmbeddedNats | None = None
    store: LocalPgvector | None = None
    why: Callable[[Child, int], str] = lambda child, code: ""

    def tend(self) -> bool:
        """Start again whatever died (see the module's rule); False when the stack must stop: a failed
        start, or a process that died too often."""
        if self.nats is not None and not self.nats.running:
            if not self.restarts.allow("nats-server"):
                return False
            log.error("nats-server exited; starting it again")
            self.nats.start()
        if self.store is not None and not self.store.running:
            if not self.restarts.allow("postgres"):
                return False
            log.error("PostgreSQL (pgvector) exited; starting it again")
            self.store.start()
        for child in self.plan:
            code = self.fleet.exited(child)
            if code is None:
                continue
            if not self.fleet.was_ready(child) and code >= 0:
                log.error("%s exited with %s during start-up%s", child.name, code, self.why(child, code))
                return False
            if not self.restarts.allow(child.name):
                return False
            log.error("%s exited with %s; starting it again", child.name, code)
            self.fleet.start(child)
        return True
