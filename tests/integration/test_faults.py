"""Online requests survive faults, on real processes and a real nats-server.

A worker killed with SIGKILL while it holds rows of a request, a tokenizer killed during traffic, a
worker stopped (SIGSTOP: the slowest worker there is), nats-server stopped and started again, a
worker stopped with SIGTERM during traffic. Each time every request gets an answer within its
deadline, the answers that succeed hold the right vectors, and the stack serves again afterwards
with no manual step.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import numpy as np
import pytest

from embedfleet.shared.nats.server import EmbeddedNats, free_port
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import medium_texts
from tests.support.procs import Service, count_services, healthy, holds_rows, scraped, wait_until

# the answers must come within deadlines of seconds on one-thread workers: with the machine to itself
pytestmark = [pytest.mark.integration, pytest.mark.serial]

MODEL = "all-MiniLM-L6-v2"
DEADLINE = 20.0  # the gateway's --request-timeout
SHORT_DEADLINE = 4.0  # a second gateway's, for the test that waits one out
TEXTS = medium_texts(320)  # ~16k tokens: seconds of work for two one-thread workers
IN_FLIGHT = 8  # requests kept in flight while a process is killed
# seconds after a process's SIGKILL within which the gateway finds it gone (its liveness checks run every
# 0.2 s while requests are in flight); room for a loaded two-core machine
FOUND_GONE_WITHIN = 1.0


@dataclass
class Fleet:
    nats: EmbeddedNats
    folder: Path
    base_url: str = ""
    port: int = 0
    short_url: str = ""  # the gateway with SHORT_DEADLINE
    short_port: int = 0
    services: dict[str, Service] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)  # tokenizers' and workers'
    expected: np.ndarray | None = None

    def start(self, name: str) -> Service:
        common = ["--nats", self.nats.url]
        role = name.split("-")[0]
        if role in ("tokenizer", "worker"):
            self.metrics_ports[name] = free_port()
            common += ["--metrics-port", str(self.metrics_ports[name])]
        if role == "tokenizer":
            # small chunks: a request is spread over both workers
            service = Service("tokenizer", [*common, "--chunk-seqs", "8"], self.folder)
        elif role == "worker":
            service = Service("worker", [*common, "--max-batch-tokens", "512"], self.folder, {"OMP_NUM_THREADS": "1"})
        elif name == "gateway-short":
            service = Service(
                "gateway",
                [*common, "--port", str(self.short_port), "--request-timeout", str(SHORT_DEADLINE)],
                self.folder,
            )
        else:
            service = Service(
                "gateway", [*common, "--port", str(self.port), "--request-timeout", str(DEADLINE)], self.folder
            )
        self.services[name] = service
        return service

    def holds_rows(self, worker: str) -> bool:
        return holds_rows(self.metrics_ports[worker], MODEL)

    def tokenized(self) -> float:
        """Online inputs the live tokenizers have tokenized: a request's rows sent again are tokenized again."""
        return sum(
            scraped(self.metrics_ports[name], "embedfleet_tokenizer_inputs_total", model=MODEL, queue="online")
            for name, s in self.services.items()
            if name.startswith("tokenizer") and s.alive
        )

    def workers(self) -> int:
        return count_services(self.nats.url, "worker")

    def wait_serving(self, workers: int = 2, tokenizers: int = 2) -> None:
        procs = [s for s in self.services.values() if s.alive]
        wait_until(lambda: healthy(self.base_url) and healthy(self.short_url), 120, "gateways' health", procs)
        wait_until(lambda: self.workers() == workers, 120, f"{workers} workers", procs)
        wait_until(
            lambda: count_services(self.nats.url, "tokenizer") == tokenizers, 60, f"{tokenizers} tokenizers", procs
        )

    def replace(self, name: str) -> None:
        """Start a fresh process in place of a dead one (what Kubernetes or `embedfleet up` does)."""
        old = self.services[name]
        if old.alive:
            old.stop()
        self.start(name)

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{s.log()[-3000:]}" for name, s in self.services.items())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, reference) -> Iterator[Fleet]:
    folder = tmp_path_factory.mktemp("faults")
    server = EmbeddedNats(folder / "nats")
    server.start()
    f = Fleet(server, folder, port=free_port(), short_port=free_port())
    f.base_url = f"http://127.0.0.1:{f.port}"
    f.short_url = f"http://127.0.0.1:{f.short_port}"
    try:
        for name in ("tokenizer-1", "tokenizer-2", "worker-1", "worker-2", "gateway", "gateway-short"):
            f.start(name)
        f.wait_serving()
        f.expected = reference.encode(TEXTS)
        yield f
    finally:
        for s in f.services.values():
            s.stop()
        f.nats.stop()  # the server running now: a test may have replaced the first


@pytest.fixture
def serving(fleet: Fleet) -> Iterator[Fleet]:
    """The fleet at full strength before a test, and again after it (dead processes replaced)."""
    yield fleet
    if not fleet.nats.running:
        fleet.nats = EmbeddedNats(fleet.nats.data_dir, port=fleet.nats.port)
        fleet.nats.start()
    for name, service in list(fleet.services.items()):
        if not service.alive:
            fleet.replace(name)
        elif service.proc.pid and _stopped(service.proc.pid):
            os.kill(service.proc.pid, signal.SIGCONT)
    fleet.wait_serving()


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("T")
    except OSError:
        return False


def embed(base_url: str, texts: list[str], timeout: float = DEADLINE + 10) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    r = httpx.post(f"{base_url}/v1/embeddings", json={"model": MODEL, "input": texts}, timeout=timeout)
    return r, time.monotonic() - started


def vectors(r: httpx.Response) -> np.ndarray:
    return np.array([d["embedding"] for d in r.json()["data"]], np.float32)


def check_right(fleet: Fleet, r: httpx.Response, rows: slice = slice(None)) -> None:
    assert r.status_code == 200, f"{r.status_code} {r.text[:300]}\n{fleet.logs()}"
    got = vectors(r)
    assert got.shape == fleet.expected[rows].shape
    assert cosines(got, fleet.expected[rows]).min() >= COSINE_TOLERANCE


def each_answered_again(results: list[list], seen: list[int], what: str) -> None:
    """Wait until every loop of ``timed_traffic`` has answers past the ``seen`` counts: each request in flight
    when they were taken has been answered."""
    wait_until(lambda: all(len(r) > n for r, n in zip(results, seen)), DEADLINE + 10, what)


def test_worker_killed_while_holding_rows_of_a_request(serving: Fleet):
    """SIGKILL a worker while a request's chunks sit on both workers: the gateway sends the rows the
    dead worker held again (embedding is idempotent) and the request succeeds within its deadline."""
    fleet = serving
    tokenized = fleet.tokenized()
    result: dict[str, tuple[httpx.Response, float]] = {}
    thread = threading.Thread(target=lambda: result.setdefault("r", embed(fleet.base_url, TEXTS)))
    thread.start()
    # 40 chunks of 8 texts spread over both workers: seconds of work on one thread each
    wait_until(lambda: fleet.holds_rows("worker-1") or not thread.is_alive(), DEADLINE, "worker-1 to hold rows")
    assert thread.is_alive(), "the request finished before the worker was killed"
    fleet.services["worker-1"].kill()
    thread.join(DEADLINE + 10)
    r, took = result["r"]
    check_right(fleet, r)
    assert took < DEADLINE
    # the rows the dead worker held were sent again: tokenized twice (a tokenizer counts a request as
    # it sends its chunks: polled, not read once)
    wait_until(lambda: fleet.tokenized() - tokenized > len(TEXTS), 10, "rows tokenized again")


@dataclass(frozen=True)
class Answered:
    status: int
    started: float  # monotonic seconds
    ended: float


def timed_traffic(fleet: Fleet, stop: threading.Event, results: list[list[Answered]], size: int) -> None:
    """A loop per list of ``results`` sending requests of ``size`` texts until ``stop``, each answer's
    status and times appended to its loop's list."""

    def loop(k: int) -> None:
        i = k * 5
        while not stop.is_set():
            first = (i * size) % (len(TEXTS) - size)
            started = time.monotonic()
            r, _ = embed(fleet.base_url, TEXTS[first : first + size])
            results[k].append(Answered(r.status_code, started, time.monotonic()))
            if r.status_code == 200:
                check_right(fleet, r, slice(first, first + size))
            i += 1

    with ThreadPoolExecutor(len(results)) as pool:
        for future in [pool.submit(loop, k) for k in range(len(results))]:
            future.result()


@dataclass(frozen=True)
class KillUnderLoad:
    answers: list[Answered]
    slowest_before: float  # seconds: the longest wait of a request answered before the kill
    waits: list[float]  # seconds from the kill to the answer of each request in flight at it
    found_after: float  # seconds from the kill to the gateway's finding the process gone


def _found_gone(gateway_log: str, role: str, after: float) -> float | None:
    """When (epoch seconds) the gateway logged a ``role`` process gone, at or after ``after``."""
    for line in gateway_log.splitlines():
        if f"embedfleet.fleet: {role} " in line and "is gone" in line:
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at >= after - 0.01:  # the log's clock in milliseconds
                return at
    return None


def killed_under_load(fleet: Fleet, name: str, busy: Callable[[], bool]) -> KillUnderLoad:
    """SIGKILL ``name`` once ``busy()`` while 8 requests of one text each are in flight (a light load: the
    wait measured is the fault's more than the queue's)."""
    stop = threading.Event()
    results: list[list[Answered]] = [[] for _ in range(IN_FLIGHT)]
    thread = threading.Thread(target=timed_traffic, args=(fleet, stop, results, 1))
    thread.start()
    try:
        each_answered_again(results, [0] * len(results), "requests flowing")
        wait_until(busy, DEADLINE, f"{name} to hold work")
        killed_at, killed_wall = time.monotonic(), time.time()
        fleet.services[name].kill()
        each_answered_again(results, [len(r) for r in results], "the requests in flight at the kill answered")
    finally:
        stop.set()
        thread.join(DEADLINE + 10)
    done = [d for r in results for d in r]
    found = _found_gone(fleet.services["gateway"].log(), name.split("-")[0], killed_wall)
    assert found is not None, fleet.logs()
    return KillUnderLoad(
        done,
        max(d.ended - d.started for d in done if d.ended < killed_at),
        [d.ended - killed_at for d in done if d.started < killed_at < d.ended],
        found - killed_wall,
    )


def check_kill_under_load(fleet: Fleet, name: str, run: KillUnderLoad) -> None:
    assert all(d.status == 200 for d in run.answers), (sorted({d.status for d in run.answers}), fleet.logs())
    assert run.waits, "no request was in flight at the kill"
    print(
        f"{name} killed: found gone after {run.found_after:.2f}s; the {len(run.waits)} requests in flight answered "
        f"at most {max(run.waits):.2f}s after the kill (the slowest before it took {run.slowest_before:.2f}s)"
    )
    # within a liveness check (0.2 s) of the kill, with room for a loaded machine's event loops
    assert run.found_after < FOUND_GONE_WITHIN, fleet.logs()
    # the kill adds under a second to the requests it caught
    assert max(run.waits) < run.slowest_before + 1.0, (run.waits, fleet.logs())


def test_requests_a_killed_worker_held_are_answered_within_a_second(serving: Fleet):
    """SIGKILL one of two workers while 8 requests are in flight: every request is answered, and right;
    the gateway finds the worker's connection gone within a liveness check and sends the rows it held
    (and those no worker held yet) to the other."""
    fleet = serving
    check_kill_under_load(fleet, "worker-1", killed_under_load(fleet, "worker-1", lambda: fleet.holds_rows("worker-1")))


def test_requests_a_killed_tokenizer_held_are_answered_within_a_second(serving: Fleet):
    """SIGKILL one of two tokenizers while 8 requests are in flight: every request is answered, and right;
    the rows no worker held yet are sent again as soon as the gateway finds the tokenizer gone."""
    fleet = serving
    check_kill_under_load(fleet, "tokenizer-1", killed_under_load(fleet, "tokenizer-1", lambda: fleet.tokenized() > 0))


def test_rows_wait_for_a_worker_and_get_503_before_the_deadline(serving: Fleet):
    """Both workers killed while they hold a request's rows, none started again: the rows wait for a
    worker to serve the model again; none comes, and the answer is a 503 in the API's error shape just
    before the deadline, not a 504 at it."""
    fleet = serving
    result: dict[str, tuple[httpx.Response, float]] = {}
    thread = threading.Thread(target=lambda: result.setdefault("r", embed(fleet.short_url, TEXTS[:64])))
    thread.start()
    wait_until(
        lambda: fleet.holds_rows("worker-1") or fleet.holds_rows("worker-2") or not thread.is_alive(),
        SHORT_DEADLINE,
        "the request's rows in a worker",
    )
    assert thread.is_alive(), "the request finished before the workers were killed"
    fleet.services["worker-1"].kill()
    fleet.services["worker-2"].kill()
    thread.join(SHORT_DEADLINE + 10)
    r, took = result["r"]
    assert r.status_code == 503, r.text
    assert r.json()["error"]["message"] == "no tokenizer or worker is serving this model right now"
    # the gateway gives up 0.2 s before its deadline; the client's clock also counts the HTTP exchange
    assert SHORT_DEADLINE - 1.5 < took < SHORT_DEADLINE + 2, took


def test_stopped_worker_rows_are_served_by_the_other(serving: Fleet):
    """A worker that stops answering (SIGSTOP) is taken for dead after three silent fleet polls: the
    rows it holds go to the other worker, well within the deadline."""
    fleet = serving
    slow = fleet.services["worker-2"]
    result: dict[str, tuple[httpx.Response, float]] = {}
    thread = threading.Thread(target=lambda: result.setdefault("r", embed(fleet.base_url, TEXTS[:64])))
    thread.start()
    wait_until(lambda: fleet.holds_rows("worker-2") or not thread.is_alive(), DEADLINE, "worker-2 to hold rows")
    assert thread.is_alive(), "the request finished before the worker was stopped"
    os.kill(slow.proc.pid, signal.SIGSTOP)
    try:
        thread.join(DEADLINE + 10)
        r, took = result["r"]
        check_right(fleet, r, slice(0, 64))
        assert took < DEADLINE / 2
    finally:
        os.kill(slow.proc.pid, signal.SIGCONT)


def test_deadline_is_honoured_when_no_worker_answers(serving: Fleet):
    """Every worker stopped: the request is answered at its deadline, not later, in the API's error
    shape: 504, or 503 where the gateway took the silent workers for dead first (three silent fleet
    polls: nobody serves the model, and its rows waited for a worker until just before the deadline);
    once the workers resume the stack serves again."""
    fleet = serving
    pids = [fleet.services[name].proc.pid for name in ("worker-1", "worker-2")]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        r, took = embed(fleet.short_url, ["a query nobody will answer"])
        assert r.status_code in (503, 504), r.text
        message = r.json()["error"]["message"]
        if r.status_code == 504:
            assert message.startswith("no complete result within"), message
        else:
            assert message == "no tokenizer or worker is serving this model right now", message
        # the gateway gives up 0.2 s before its deadline when it waits for a worker; the client's clock
        # also counts the HTTP exchange
        assert SHORT_DEADLINE - 1.5 <= took < SHORT_DEADLINE + 2, took
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    fleet.wait_serving()
    r, _ = embed(fleet.short_url, TEXTS[:8])
    check_right(fleet, r, slice(0, 8))


def test_nats_restart_fails_fast_then_serves_again(serving: Fleet):
    """nats-server stopped with a request in flight and more arriving: each is answered 503 at once,
    none hangs; started again, every service reconnects by itself and the stack serves."""
    fleet = serving
    result: dict[str, tuple[httpx.Response, float]] = {}
    thread = threading.Thread(target=lambda: result.setdefault("r", embed(fleet.base_url, TEXTS)))
    thread.start()
    wait_until(
        lambda: fleet.holds_rows("worker-1") or fleet.holds_rows("worker-2") or not thread.is_alive(),
        DEADLINE,
        "the request's rows in a worker",
    )
    assert thread.is_alive(), "the request finished before the server was stopped"
    fleet.nats.stop()
    thread.join(DEADLINE)
    r, took = result["r"]
    assert r.status_code == 503, r.text
    assert "NATS" in r.json()["error"]["message"]
    for _ in range(5):
        r, took = embed(fleet.base_url, ["while the server is down"])
        assert r.status_code == 503 and took < 1.0, (r.status_code, took)
    fleet.nats = EmbeddedNats(fleet.nats.data_dir, port=fleet.nats.port)
    fleet.nats.start()
    fleet.wait_serving()
    r, _ = embed(fleet.base_url, TEXTS[:8])
    check_right(fleet, r, slice(0, 8))


def test_sigterm_drains_a_worker_during_traffic(serving: Fleet):
    """SIGTERM a worker while requests flow: it finishes what it accepted, then exits 0; no request
    fails and none is sent again (nothing was lost)."""
    fleet = serving
    tokenized = fleet.tokenized()
    stop = threading.Event()
    results: list[list] = [[] for _ in range(3)]
    thread = threading.Thread(target=timed_traffic, args=(fleet, stop, results, 16))
    thread.start()
    each_answered_again(results, [0] * len(results), "requests flowing")
    worker = fleet.services["worker-1"]
    assert worker.stop(timeout=60) == 0, worker.log()[-2000:]
    each_answered_again(results, [len(r) for r in results], "the requests in flight at the stop answered")
    stop.set()
    thread.join(DEADLINE + 10)
    done = [d for r in results for d in r]
    assert all(a.status == 200 for a in done), (sorted({a.status for a in done}), fleet.logs())
    # every row tokenized once: none was sent again
    wait_until(lambda: fleet.tokenized() - tokenized >= 16 * len(done), 10, "every request's rows tokenized")
    assert fleet.tokenized() - tokenized == 16 * len(done)
