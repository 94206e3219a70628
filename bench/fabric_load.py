"""The parts of ``bench.fabric``: the stack as ``embedfleet up`` starts it, each process's CPU read
from /proc, the NATS-direct client and the bulk ``reindex`` run (the floors: ``bench.fabric_floor``).

CPU is user + system time (/proc/PID/stat fields 14-17): a process's own, its threads' included, and
its child processes' (those alive, walked through /proc/PID/task/*/children, and those it waited for,
cutime + cstime), so a worker's CPU replica processes count as the worker's.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.e2e import Workload, client_batches, load_summary
from embedfleet.shared.nats.local_stack import read_stack
from embedfleet.shared.nats.server import free_port

ROLES = ("nats-server", "gateway", "tokenizer", "worker", "scorer", "up")
TICKS = os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (of every one of its threads)."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):  # gone meanwhile
        pass
    return out


def tree_seconds(pid: int, own: bool = False) -> float:
    """CPU seconds of ``pid`` and its descendants (``own``: of ``pid`` alone, its children left out)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    # fields[11:15]: utime, stime, cutime, cstime (fields 14-17 of stat, the name removed)
    ticks = int(fields[11]) + int(fields[12])
    if own:
        return ticks / TICKS
    ticks += int(fields[13]) + int(fields[14])
    return ticks / TICKS + sum(tree_seconds(c) for c in children(pid))


def self_seconds() -> float:
    """CPU seconds of this process (every thread): the in-process load client's cost."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def waited_children_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _role(pid: int) -> str | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    args = [a.decode(errors="replace") for a in argv if a]
    if args and Path(args[0]).name == "nats-server":
        return "nats-server"
    if "embedfleet.services.cli" in args and args.index("embedfleet.services.cli") + 1 < len(args):
        return args[args.index("embedfleet.services.cli") + 1]
    return None


def _option(pid: int, flag: str) -> str:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return args[args.index(flag) + 1]


@dataclass(frozen=True)
class Stack:
    """A running ``embedfleet up`` on one model folder."""

    base: str  # the gateway's URL
    nats_url: str  # without credentials
    token_file: str  # the token the embedded nats-server asks for
    model: str  # the served id
    pids: dict[str, int]  # role (ROLES) -> pid

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far by role; ``up`` itself without its children (they are the other roles)."""
        return {role: tree_seconds(pid, own=role == "up") for role, pid in self.pids.items()}

    def worker_loop_seconds(self) -> float:
        """CPU seconds of the worker's main thread (its event loop: NATS, decoding, batching, replies);
        the rest of the worker's CPU is its engine threads' (a replica's thread, torch's pool)."""
        pid = self.pids["worker"]
        try:
            with open(f"/proc/{pid}/task/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            return 0.0
        return (int(fields[11]) + int(fields[12])) / TICKS

    def forward_seconds(self) -> float:
        """The worker's summed forward time so far (embedfleet_worker_forward_seconds, every token class)."""
        from prometheus_client.parser import text_string_to_metric_families

        port = _option(self.pids["worker"], "--metrics-port")
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "embedfleet_worker_forward_seconds_sum"
        )


@contextmanager
def up_stack(
    folder: Path, data_dir: Path, log: Path, timeout: float = 300, environ: dict[str, str] | None = None
) -> Iterator[Stack]:
    """``embedfleet up --model FOLDER`` as a process, its own embedded nats-server included, once it
    has recorded itself (every process ready); stopped as Ctrl-C stops it. ``environ``: variables
    added to its environment (its processes inherit them)."""
    from embedfleet.shared.model_dir.load import load_model_info

    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "embedfleet.services.cli",
                "up",
                "--model",
                str(folder),
                "--port",
                str(port),
                "--data-dir",
                str(data_dir),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(environ or {})},
        )
    try:
        deadline = time.monotonic() + timeout
        while (record := read_stack(data_dir)) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"embedfleet up did not start (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        pids = {role: pid for pid in children(proc.pid) if (role := _role(pid)) in ROLES}
        missing = set(ROLES) - {"up"} - set(pids)
        if missing:
            raise RuntimeError(f"embedfleet up runs no {', '.join(sorted(missing))}")
        if record.token_file is None:  # its embedded nats-server always asks for a token
            raise RuntimeError("embedfleet up recorded no token file")
        yield Stack(
            f"http://127.0.0.1:{port}",
            record.url,
            record.token_file,
            load_model_info(str(folder)).id,
            {**pids, "up": proc.pid},
        )
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Meter:
    """CPU seconds of every process of a stack and of the client, and the worker's forward time, from
    ``start()`` to ``stop()``; ``client``: the client's CPU seconds so far (this process by default)."""

    def __init__(self, stack: Stack, client: Callable[[], float] = self_seconds) -> None:
        self._stack, self._client = stack, client
        self._cpu: dict[str, float] = {}
        self._forward = self._loop = 0.0

    def start(self) -> None:
        self._cpu = {**self._stack.cpu(), "client": self._client()}
        self._forward, self._loop = self._stack.forward_seconds(), self._stack.worker_loop_seconds()

    def stop(self) -> dict:
        now = {**self._stack.cpu(), "client": self._client()}
        return {
            "cpu_s": {role: now[role] - self._cpu[role] for role in now},
            "forward_s": self._stack.forward_seconds() - self._forward,
            "worker_loop_s": self._stack.worker_loop_seconds() - self._loop,
        }


async def drive_nats(
    stack: Stack, w: Workload, seconds: float, warm_up: float, tokens: dict[str, int], meter: Meter, errors: Counter
) -> dict:
    """As ``bench.e2e.drive_http``, through the public NATS-direct client (embedfleet.shared.nats.fleet_client) in this
    process: ``warm_up`` seconds, then ``seconds`` measured by ``meter`` (its ``stop()`` in the
    result); error replies counted in ``errors`` by code."""
    from embedfleet.shared.nats.fleet_client import FleetClient

    async with await FleetClient.connect(stack.nats_url, token_file=stack.token_file, timeout=60.0) as fleet:
        await _embed_for(fleet, stack.model, w, warm_up, tokens, Counter())
        meter.start()
        result = await _embed_for(fleet, stack.model, w, seconds, tokens, errors)
        return {**result, **meter.stop()}


async def _embed_for(fleet, model: str, w: Workload, seconds: float, tokens: dict[str, int], errors: Counter) -> dict:
    from embedfleet.shared.errors import ServiceError

    latencies: list[float] = []
    done_tokens = 0
    start = time.perf_counter()
    stop = start + seconds

    async def one(k: int) -> None:
        nonlocal done_tokens
        for batch in client_batches(w, k):
            if time.perf_counter() >= stop:
                break
            t = time.perf_counter()
            try:
                await fleet.embed(batch, model)
            except ServiceError as exc:
                errors[exc.code.value] += 1
                continue
            latencies.append(time.perf_counter() - t)
            done_tokens += sum(tokens[x] for x in batch)

    await asyncio.gather(*(one(k) for k in range(w.in_flight)))
    return load_summary(latencies, done_tokens, time.perf_counter() - start)


def run_reindex(stack: Stack, texts: list[str], folder: Path) -> dict:
    """``embedfleet reindex`` of ``texts`` as a process, measured by a Meter whose client is that
    process (its CPU read once it has been waited for)."""
    import numpy as np

    docs = folder / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    out = folder / "vectors.npy"
    command = [
        sys.executable,
        "-m",
        "embedfleet.services.cli",
        "reindex",
        str(docs),
        "--out",
        str(out),
        "--model",
        stack.model,
        "--nats",
        stack.nats_url,
        "--nats-token-file",
        stack.token_file,
        "--quiet",
    ]
    meter = Meter(stack, waited_children_seconds)
    meter.start()
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    took = time.perf_counter() - start
    measured = meter.stop()
    if done.returncode != 0:
        raise RuntimeError(f"reindex exited with {done.returncode}:\n{done.stderr[-3000:]}")
    rows = np.load(out, mmap_mode="r").shape[0]
    if rows != len(texts):
        raise RuntimeError(f"reindex wrote {rows} vectors for {len(texts)} documents")
    return {"documents": rows, "seconds": took, **measured}


def infinity_pid(command: str) -> int:
    """The infinity-emb server this process started (``bench.e2e.infinity_server``): a child of this
    process running ``command``."""
    for pid in children(os.getpid()):
        if command in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
            return pid
    raise RuntimeError(f"no child process runs {command}")
