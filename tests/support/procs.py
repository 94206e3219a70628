"""Start embedfleet services as real processes and wait for them, by polling, never by sleeping blind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import nats

from embedfleet.shared.nats.subjects import SERVICE_NAMES
from tests.support import waiting
from tests.support.role_images import as_deployed


class Service:
    """One service process, with its output in a log file (shown when a test fails)."""

    def __init__(self, role: str, args: list[str], log_dir: Path, env: dict[str, str] | None = None) -> None:
        if role == "up" and not any(a == "--data-dir" or a.startswith("--data-dir=") for a in args):
            # the default ./.embedfleet is the repository's: two stacks at once would meet on its lock
            raise ValueError("an `up` in the tests takes its own --data-dir (under the test's tmp_path)")
        self.role = role
        self.log_path = log_dir / f"{role}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (the process writes it until it stops)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "embedfleet.services.cli", role, *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **as_deployed(env)},
        )
        self._terminated = False

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> None:
        """SIGTERM, not waited for (``stop`` waits)."""
        if self.alive and not self._terminated:
            self.proc.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self, timeout: float = 30) -> int:
        if self.alive:
            self.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.alive:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def port_open(port: int) -> bool:
    """Whether something listens on ``port`` of 127.0.0.1."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def one_shot(
    args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> tuple[subprocess.CompletedProcess, float]:
    """An embedfleet command run to its end with no NATS URL or credential and no data folder in its
    environment (but those of ``env``), in ``cwd``; (its result, seconds it took)."""
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("EMBEDFLEET_NATS", "NATS_URL", "EMBEDFLEET_DATA"))
    }
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "embedfleet.services.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**clean, **as_deployed(env)},
        cwd=cwd,
    )
    return result, time.monotonic() - started


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, services: Sequence[Service] = ()) -> None:
    """``tests.support.waiting.wait_until`` that also fails at once, with its log, when one of ``services`` exits."""

    def check() -> bool:
        for s in services:
            if not s.alive:
                raise RuntimeError(
                    f"{s.role} exited with {s.proc.returncode} while waiting for {what}:\n{s.log()[-3000:]}"
                )
        return predicate()

    try:
        waiting.wait_until(check, timeout, what)
    except TimeoutError as exc:
        logs = "\n".join(f"--- {s.role}\n{s.log()[-2000:]}" for s in services)
        raise TimeoutError(f"{exc}\n{logs}") from None


def count_services(
    nats_url: str, role: str, wait: float = 0.3, prefix: str = "embedfleet", nkey_seed: str | None = None
) -> int:
    """How many processes of ``role`` under subject ``prefix`` answer a NATS micro-service ping
    (``nkey_seed``: as that user, where the server asks for credentials)."""
    return service_counts(nats_url, (role,), wait, prefix, nkey_seed)[role]


def service_counts(
    nats_url: str, roles: Sequence[str], wait: float = 0.3, prefix: str = "embedfleet", nkey_seed: str | None = None
) -> dict[str, int]:
    """``count_services`` for each of ``roles``, all pinged at once: one ``wait`` for them all."""

    async def ping() -> dict[str, int]:
        nc = await nats.connect(nats_url.split(","), **({"nkeys_seed": nkey_seed} if nkey_seed else {}))
        replies: dict[str, list[dict]] = {role: [] for role in roles}
        subs = []
        for role in roles:
            inbox = nc.new_inbox()

            async def on_reply(msg, found=replies[role]) -> None:
                if msg.data:  # not the server's empty "no responders" status
                    found.append(json.loads(msg.data))

            subs.append(await nc.subscribe(inbox, cb=on_reply))
            await nc.publish(f"$SRV.PING.{SERVICE_NAMES[role]}", b"", reply=inbox)
        await asyncio.sleep(wait)
        for sub in subs:
            await sub.unsubscribe()
        await nc.close()
        return {
            role: len({r["id"] for r in found if r.get("metadata", {}).get("prefix") == prefix})
            for role, found in replies.items()
        }

    return asyncio.run(ping())


async def job_settled(kv, job: str, timeout: float = 30.0) -> dict:
    """A job's state once it is no longer running (or as it is when ``timeout`` seconds have passed), as
    the bucket holds it (its record)."""
    from embedfleet.shared.jobs.bucket import read_state

    deadline = time.monotonic() + timeout
    while True:
        state = await read_state(kv, job)
        record = state.record() if state is not None else {}
        if record.get("status", "running") != "running" or time.monotonic() > deadline:
            return record
        await asyncio.sleep(0.1)


async def stored_doc_ids(js, subject: str) -> Counter:
    """How many times each document id is stored in a job's results (``subject``), read with an
    ordered consumer up to the last one stored (or until two seconds pass without one)."""
    return await _stored_rows(js, subject, lambda result: result.doc_ids)


async def stored_chunks(js, subject: str) -> Counter:
    """How many times each (document id, chunk, the document's chunks) of a chunked job is stored in its
    results (``subject``)."""
    return await _stored_rows(
        js, subject, lambda result: zip(result.doc_ids, result.chunks.chunk.tolist(), result.chunks.count.tolist())
    )


async def _stored_rows(js, subject: str, keys) -> Counter:
    from embedfleet.shared.protocol import JobResult, decode_as

    counts: Counter = Counter()
    sub = await js.subscribe(subject, ordered_consumer=True)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=2)
            except Exception:
                return counts
            counts.update(keys(decode_as(msg.data, JobResult)))
            if msg.metadata.num_pending == 0:
                return counts
    finally:
        await sub.unsubscribe()


def job_finished(base_url: str, job: str, timeout: float = 90) -> dict:
    """A job's state, as GET /v1/jobs/{id} answers it, once it has finished (polled); each answer read
    is held to the route's model."""
    from embedfleet.services.gateway.jobs.answers import JobStatus
    from embedfleet.shared.jobs.state import FINISHED

    seen: dict = {}

    def over() -> bool:
        seen.clear()
        r = httpx.get(f"{base_url}/v1/jobs/{job}", timeout=10)
        if r.status_code == 200:
            JobStatus.model_validate_json(r.content)
        seen.update(r.json())
        return seen.get("status") in FINISHED

    wait_until(over, timeout, f"job {job} finished")
    return seen


def kill_and_replace(
    services: dict[str, Service], victim: str, start: Callable[[str], None], going_on: Callable[[], bool]
) -> None:
    """SIGKILL ``victim`` in the middle of a job, then ``start`` it again as a deployment replaces it: a
    tokenizer after a moment's outage (the job waits with none), a worker once the job goes on with the
    others (``going_on``)."""
    services[victim].kill()
    if victim == "tokenizer":
        time.sleep(1.0)
    else:
        others = [s for name, s in services.items() if s.role == "worker" and name != victim]
        wait_until(going_on, 60, "the job going on with the other workers", others)
    start(victim)


def healthy(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def another_gateway(nats_url: str, args: Sequence[str], log_dir: Path, what: str = "another gateway") -> Iterator[str]:
    """One more gateway on the fleet at ``nats_url`` with ``args``, for a fixture to yield from: yields
    its base URL once healthy, stops it after."""
    from embedfleet.shared.nats.server import free_port

    port = free_port()
    gateway = Service("gateway", ["--nats", nats_url, "--port", str(port), *args], log_dir)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthy(base), 60, what, [gateway])
        yield base
    finally:
        gateway.stop()


def post(
    base_url: str, path: str, body: object, status: int | None = None, timeout: float = 120, **kw
) -> httpx.Response:
    """``body`` POSTed as JSON to ``base_url`` + ``path`` (``kw``: httpx's, headers say); with ``status``,
    the answer must have that status (its text shown when not)."""
    r = httpx.post(f"{base_url}{path}", json=body, timeout=timeout, **kw)
    if status is not None:
        assert r.status_code == status, (path, r.status_code, r.text)
    return r


def cli(
    args: Sequence[str], timeout: float = 120, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """``python -m embedfleet.services.cli ARGS`` run to its end in this environment (plus ``env``), in
    ``cwd``; its output captured as text. ``one_shot`` runs one with the NATS settings left out."""
    return subprocess.run(
        [sys.executable, "-m", "embedfleet.services.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **as_deployed(dict(env or {}))},
        cwd=cwd,
    )


ROLES_WAITED = ("worker", "tokenizer", "scorer")  # the roles whose processes answer a NATS ping


def _listed(services: Mapping[str, Service] | Sequence[Service]) -> list[Service]:
    return list(services.values()) if isinstance(services, Mapping) else list(services)


def wait_ready(
    services: Mapping[str, Service] | Sequence[Service],
    nats_url: str,
    base_url: str | None = None,
    *,
    prefix: str = "embedfleet",
    nkey_seed: str | None = None,
    timeout: float = 180,
) -> None:
    """Until the gateway at ``base_url`` (where given) is healthy and as many workers, tokenizers and
    scorers answer on subjects under ``prefix`` as ``services`` hold (``nkey_seed``: asked as that user);
    fails at once, with its log, when one of them exits."""
    procs = _listed(services)
    if base_url is not None:
        wait_until(lambda: healthy(base_url), timeout, "gateway health", procs)
    for role in ROLES_WAITED:
        n = sum(s.role == role for s in procs)
        if n:
            wait_until(_answering(nats_url, role, n, prefix, nkey_seed), timeout, f"{n} {role} process(es)", procs)


def _answering(nats_url: str, role: str, n: int, prefix: str, nkey_seed: str | None) -> Callable[[], bool]:
    """Whether ``n`` processes of ``role`` answer on NATS now."""
    return lambda: count_services(nats_url, role, prefix=prefix, nkey_seed=nkey_seed) == n


def stop_all(services: Mapping[str, Service] | Sequence[Service]) -> None:
    """Stop every one of ``services``: all told at once, so that they stop side by side."""
    procs = _listed(services)
    for s in procs:
        s.terminate()
    for s in procs:
        s.stop()


@contextmanager
def running(
    services: Mapping[str, Service] | Sequence[Service], nats_url: str, base_url: str | None = None, **kw
) -> Iterator[None]:
    """``services`` ready (``wait_ready``'s arguments), stopped when the block ends; a mapping is read
    again then, so that processes a test put in place of dead ones are stopped too."""
    try:
        wait_ready(services, nats_url, base_url, **kw)
        yield
    finally:
        stop_all(services)


def fleet_services(
    nats_url: str,
    prefix: str,
    folders: Mapping[str, Path],
    log_dir: Path,
    *,
    named: bool = False,
    scored: Collection[str] = (),
) -> list[Service]:
    """A tokenizer and a one-thread worker per model folder (``named``: served under its key, else the
    folder's name), and a scorer for each of ``scored``'s keys, on subjects under ``prefix``."""
    common = ["--nats", nats_url, "--subject-prefix", prefix]
    services: list[Service] = []
    for name, folder in folders.items():
        model = ["--model", str(folder)] + (["--model-name", name] if named else [])
        services.append(Service("tokenizer", [*common, *model], log_dir))
        services.append(
            Service("worker", [*common, *model, "--max-batch-tokens", "1024"], log_dir, {"OMP_NUM_THREADS": "1"})
        )
        if name in scored:
            services.append(Service("scorer", [*common, *model], log_dir))
    return services


def start_fleet(
    nats_url: str,
    prefix: str,
    folders: Mapping[str, Path],
    log_dir: Path,
    *,
    named: bool = False,
    scored: Collection[str] = (),
    extra: Sequence[Service] = (),
) -> tuple[str, list[Service]]:
    """``fleet_services``, the ``extra`` services, and a gateway, all on subjects under ``prefix``;
    returns the gateway's URL and the services once the gateway is healthy and every worker, tokenizer
    and scorer answers (the caller stops them)."""
    from embedfleet.shared.nats.server import free_port

    services = [*fleet_services(nats_url, prefix, folders, log_dir, named=named, scored=scored), *extra]
    port = free_port()
    services.append(Service("gateway", ["--nats", nats_url, "--subject-prefix", prefix, "--port", str(port)], log_dir))
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(services, nats_url, base_url, prefix=prefix, timeout=240)
    except BaseException:
        stop_all(services)
        raise
    return base_url, services


@contextmanager
def running_fleet(
    nats_url: str, prefix: str, folders: Mapping[str, Path], log_dir: Path, **kw
) -> Iterator[tuple[str, list[Service]]]:
    """``start_fleet``'s fleet for the block: (the gateway's URL, the services), stopped after."""
    base_url, services = start_fleet(nats_url, prefix, folders, log_dir, **kw)
    try:
        yield base_url, services
    finally:
        stop_all(services)


def scraped(port: int, sample: str, **labels: str) -> float:
    """One sample of the metrics a process serves on ``port`` (--metrics-port); 0 while it does not
    answer (not up yet, or stopped)."""
    from tests.support.prometheus_text import value

    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return 0.0
    return value(text, sample, **labels)


def holds_rows(port: int, model: str) -> bool:
    """Whether the worker serving metrics on ``port`` has online token batches queued (rows of a request)."""
    return scraped(port, "embedfleet_worker_queue_depth", model=model, queue="online") > 0
