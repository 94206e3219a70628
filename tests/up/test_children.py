"""`embedfleet up`'s rule for a death, from the first process started to the stop: only a process
that exits by itself before it was ever ready fails the start; any other death is started again,
within --restart-limit."""

from __future__ import annotations

import signal
from pathlib import Path

from embedfleet.services.up.children import Fleet, Restarts, Supervisor
from embedfleet.services.up.plan import Child


class _Fleet(Fleet):
    """The stack's Fleet, its processes dying when told instead of running."""

    def __init__(self) -> None:
        super().__init__({})
        self.codes: dict[str, int | None] = {}
        self.starts: list[str] = []

    def exited(self, child: Child) -> int | None:
        return self.codes.get(child.name)

    def start(self, child: Child) -> None:
        child.ready.unlink(missing_ok=True)
        self.codes[child.name] = None
        self.starts.append(child.name)


def _supervised(tmp_path: Path, limit: int = 5) -> tuple[Supervisor, _Fleet, Child]:
    worker = Child("worker[m]", "worker", (), tmp_path / "worker-m")
    fleet = _Fleet()
    return Supervisor([worker], fleet, Restarts(limit, 60), why=lambda c, code: f" (why: {code})"), fleet, worker


def test_a_process_that_was_ready_is_started_again(tmp_path, caplog):
    supervisor, fleet, worker = _supervised(tmp_path)
    worker.ready.touch()  # ready once: serving users, whether or not up's start-up is over
    fleet.codes[worker.name] = -signal.SIGKILL
    assert supervisor.tend() and fleet.starts == [worker.name]
    assert "worker[m] exited with -9; starting it again" in caplog.text and "start-up" not in caplog.text
    fleet.codes[worker.name] = 1  # exits by itself after it served: a death like any other
    assert supervisor.tend() and fleet.starts == [worker.name] * 2


def test_a_process_killed_before_it_was_ready_is_started_again(tmp_path):
    supervisor, fleet, worker = _supervised(tmp_path)
    fleet.codes[worker.name] = -signal.SIGKILL  # the OOM killer, while the model loads
    assert supervisor.tend() and fleet.starts == [worker.name]


def test_a_process_that_exits_before_it_was_ever_ready_fails_the_start(tmp_path, caplog):
    supervisor, fleet, worker = _supervised(tmp_path)
    fleet.codes[worker.name] = 2  # its own error: an option, a model, a port
    assert not supervisor.tend() and fleet.starts == []
    assert "worker[m] exited with 2 during start-up (why: 2)" in caplog.text


def test_a_process_that_dies_too_often_stops_the_stack(tmp_path, caplog):
    supervisor, fleet, worker = _supervised(tmp_path, limit=2)
    for _ in range(2):
        fleet.codes[worker.name] = -signal.SIGKILL
        assert supervisor.tend()
    fleet.codes[worker.name] = -signal.SIGKILL
    assert not supervisor.tend() and len(fleet.starts) == 2
    assert "worker[m] died 3 times within 60s; stopping the stack" in caplog.text
