"""Bulk jobs survive faults, on real processes and a real nats-server: a worker killed with SIGKILL,
the tokenizer killed, nats-server killed and restarted, each in the middle of a job. Each time the
job completes, every document id is stored exactly once in the results stream, the output holds
every id once in input order, and the vectors equal a clean run's."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import nats
import numpy as np
import pytest

from shared.jobs import read_state, stream_names
from shared.nats_server import EmbeddedNats
from shared.protocol import JobResult, decode_as
from shared.subjects import Subjects
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.corpus import mixed_texts
from tests.integration.procs import Service, count_services, wait_until

pytestmark = pytest.mark.integration

DOCUMENTS = 800
BATCH = 16
# a short ack wait, so that the batches a killed process held come back within seconds
HOLD = ["--ack-wait", "4"]
SUBJECTS = Subjects("embedfleet")


@dataclass
class FaultStack:
    nats: EmbeddedNats
    folder: Path
    docs: Path
    texts: list[str]
    services: dict[str, Service] = field(default_factory=dict)
    clean: np.ndarray | None = None

    def start(self, name: str) -> None:
        common = ["--nats", self.nats.url, *HOLD]
        if name == "tokenizer":
            self.services[name] = Service("tokenizer", [*common, "--chunk-seqs", "16", "--bulk-ahead", "4"], self.folder)
        else:
            self.services[name] = Service("worker", [*common, "--max-batch-tokens", "2048"], self.folder,
                                          {"OMP_NUM_THREADS": "1"})

    def reindex(self, job: str, out: Path) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "services.cli", "reindex", str(self.docs), "--out", str(out), "--nats", self.nats.url,
             "--batch-size", str(BATCH), "--job-id", job, "--quiet", "--stall-timeout", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{s.log()[-2500:]}" for n, s in self.services.items())


@pytest.fixture(scope="module")
def faults(tmp_path_factory) -> Iterator[FaultStack]:
    folder = tmp_path_factory.mktemp("faults")
    server = EmbeddedNats(folder / "nats")
    server.start()
    texts = mixed_texts(DOCUMENTS)
    docs = folder / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    stack = FaultStack(server, folder, docs, texts)
    try:
        for name in ("tokenizer", "worker-1", "worker-2"):
            stack.start(name)
        wait_until(lambda: count_services(server.url, "worker") == 2 and count_services(server.url, "tokenizer") == 1,
                   120, "tokenizer and two workers", list(stack.services.values()))
        out = folder / "clean.npy"
        clean = stack.reindex("clean", out)
        assert clean.wait(300) == 0, clean.stdout.read() + stack.logs()
        stack.clean = np.load(out)
        yield stack
    finally:
        for s in stack.services.values():
            s.stop()
        server.stop()


def _state(url: str, job: str) -> dict:
    async def read() -> dict:
        nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
        try:
            return (await read_state(await nc.jetstream().key_value(stream_names(SUBJECTS)["kv"]), job)) or {}
        finally:
            await nc.close()

    try:
        return asyncio.run(read())
    except Exception:
        return {}


def _stored_ids(url: str, job: str) -> Counter:
    """How many times each document id is stored in the job's results."""

    async def read() -> Counter:
        nc = await nats.connect(url)
        js = nc.jetstream()
        counts: Counter = Counter()
        sub = await js.subscribe(SUBJECTS.results(job), ordered_consumer=True)
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=1)
                except Exception:
                    return counts
                counts.update(decode_as(msg.data, JobResult).doc_ids)
        finally:
            await sub.unsubscribe()
            await nc.close()

    return asyncio.run(read())


def _wait_mid_job(stack: FaultStack, job: str, proc: subprocess.Popen) -> int:
    """Block until some but not all documents are stored; return how many."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done = _state(stack.nats.url, job).get("done", 0)
        if done >= 4 * BATCH:
            assert done < DOCUMENTS, "the job ended before the fault: make it longer"
            return done
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    raise TimeoutError(f"job {job} made no progress\n{stack.logs()}")


def _check_complete(stack: FaultStack, job: str, proc: subprocess.Popen, out: Path, reference) -> None:
    try:
        rc = proc.wait(300)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"job {job} did not finish\n{stack.logs()}")
    output = proc.stdout.read()
    assert rc == 0, output + stack.logs()
    ids = json.loads(out.with_suffix(".ids.json").read_text())
    assert ids == [f"d{i}" for i in range(DOCUMENTS)]
    stored = _stored_ids(stack.nats.url, job)
    assert len(stored) == DOCUMENTS and set(stored.values()) == {1}, Counter(stored.values())
    vectors = np.load(out)
    # the same vectors as the clean run (batches are packed with other neighbours: float noise only)
    np.testing.assert_allclose(vectors, stack.clean, atol=2e-5)
    assert cosines(vectors[:50], reference.encode(stack.texts[:50])).min() >= COSINE_TOLERANCE
    state = _state(stack.nats.url, job)
    assert state["status"] == "done" and state.get("failed", 0) == 0 and not state.get("errors"), state


def test_worker_killed_mid_job(faults, reference, tmp_path):
    out = tmp_path / "v.npy"
    proc = faults.reindex("kill-worker", out)
    _wait_mid_job(faults, "kill-worker", proc)
    faults.services["worker-1"].kill()  # SIGKILL: the batches it held are never acknowledged
    time.sleep(1.0)
    faults.start("worker-1")  # the fleet replaces it, as a deployment would
    _check_complete(faults, "kill-worker", proc, out, reference)


def test_tokenizer_killed_mid_job(faults, reference, tmp_path):
    out = tmp_path / "v.npy"
    proc = faults.reindex("kill-tokenizer", out)
    _wait_mid_job(faults, "kill-tokenizer", proc)
    faults.services["tokenizer"].kill()
    state = _state(faults.nats.url, "kill-tokenizer")
    assert state["done"] < DOCUMENTS
    time.sleep(1.0)
    faults.start("tokenizer")
    _check_complete(faults, "kill-tokenizer", proc, out, reference)


def test_nats_server_restarted_mid_job(faults, reference, tmp_path):
    out = tmp_path / "v.npy"
    proc = faults.reindex("restart-nats", out)
    _wait_mid_job(faults, "restart-nats", proc)
    faults.nats.kill()  # SIGKILL: the store is recovered from disk on start
    time.sleep(1.0)
    faults.nats.start()
    _check_complete(faults, "restart-nats", proc, out, reference)
    assert all(s.alive for s in faults.services.values()), faults.logs()
