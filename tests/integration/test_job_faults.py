"""Bulk jobs survive faults, on real processes and a real nats-server: a worker killed with SIGKILL,
the tokenizer killed, nats-server killed and restarted, each in the middle of a job. Each time the
job completes, every document id is stored exactly once in the results stream, the output holds
every id once in input order, and the vectors equal a clean run's. A worker killed between storing
a result and counting it leaves the job's counts exact; a worker stopped with SIGTERM mid-job hands
its work over without stalling the job."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nats
import numpy as np
import pytest

from embedfleet.shared.jobs.bucket import read_state
from embedfleet.shared.jobs.publish import submit
from embedfleet.shared.jobs.streams import stream_names
from embedfleet.shared.nats.server import EmbeddedNats
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import EmbedOptions
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import mixed_texts
from tests.support.late_reference import Reference
from tests.support.procs import (
    Service,
    count_services,
    kill_and_replace,
    stop_all,
    stored_chunks,
    stored_doc_ids,
    wait_ready,
    wait_until,
)

pytestmark = pytest.mark.integration

DOCUMENTS = 240
CHUNKED = (
    128  # the chunked jobs' documents (the first ones, 16 whole help topics among them): many chunks, as long a job
)
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
            self.services[name] = Service(
                "tokenizer", [*common, "--chunk-seqs", "16", "--bulk-ahead", "4"], self.folder
            )
        else:
            self.services[name] = Service(
                "worker", [*common, "--max-batch-tokens", "2048"], self.folder, {"OMP_NUM_THREADS": "1"}
            )

    def reindex(self, job: str, out: Path, *more: str) -> subprocess.Popen:
        return self.reindex_to(job, "--out", str(out), *more)

    def reindex_to(self, job: str, *args: str, docs: Path | None = None) -> subprocess.Popen:
        """``embedfleet reindex`` of the stack's documents (or of ``docs``) as job ``job``, writing where
        ``args`` say."""
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "embedfleet.services.cli",
                "reindex",
                str(docs or self.docs),
                "--nats",
                self.nats.url,
                "--batch-size",
                str(BATCH),
                "--job-id",
                job,
                "--quiet",
                "--stall-timeout",
                "60",
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
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
        wait_ready(stack.services, server.url, timeout=120)
        out = folder / "clean.npy"
        clean = stack.reindex("clean", out)
        assert clean.wait(300) == 0, clean.stdout.read() + stack.logs()
        stack.clean = np.load(out)
        yield stack
    finally:
        stop_all(stack.services)
        server.stop()


def _state(url: str, job: str, subjects: Subjects = SUBJECTS) -> dict:
    async def read() -> dict:
        nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
        try:
            state = await read_state(await nc.jetstream().key_value(stream_names(subjects)["kv"]), job)
            return state.record() if state is not None else {}  # as the bucket holds it
        finally:
            await nc.close()

    try:
        return asyncio.run(read())
    except Exception:
        return {}


def _stored_ids(url: str, job: str, subjects: Subjects = SUBJECTS) -> Counter:
    """How many times each document id is stored in the job's results."""

    async def read() -> Counter:
        nc = await nats.connect(url)
        try:
            return await stored_doc_ids(nc.jetstream(), subjects.results(job))
        finally:
            await nc.close()

    return asyncio.run(read())


def _wait_mid_job(stack: FaultStack, job: str, proc: subprocess.Popen, total: int = DOCUMENTS) -> int:
    """Block until some but not all of the job's ``total`` documents are stored; return how many."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done = _state(stack.nats.url, job).get("done", 0)
        if done >= 4 * BATCH:
            assert done < total, "the job ended before the fault: make it longer"
            return done
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    raise TimeoutError(f"job {job} made no progress\n{stack.logs()}")


def _check_complete(stack: FaultStack, job: str, proc: subprocess.Popen, out: Path, reference) -> None:
    try:
        rc = proc.wait(300)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"job {job} did not finish\n{stack.logs()}") from None
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
    done = _wait_mid_job(faults, "kill-worker", proc)
    faults.services["worker-1"].kill()  # SIGKILL: the batches it held are never acknowledged
    wait_until(
        lambda: _state(faults.nats.url, "kill-worker").get("done", 0) > done,
        60,
        "the job going on with one worker",
        [faults.services["worker-2"]],
    )
    faults.start("worker-1")  # the fleet replaces it, as a deployment would
    _check_complete(faults, "kill-worker", proc, out, reference)


@pytest.mark.parametrize(
    "victim, late",
    [("worker-1", False), ("tokenizer", False), ("worker-1", True)],
    ids=["worker-1", "tokenizer", "worker-1-late"],
)
def test_a_process_killed_mid_chunked_job(faults, reference, model_info, tmp_path, victim, late):
    """A chunked job (a row a chunk; late: a window a sequence, a vector a chunk it owns) whose worker,
    or tokenizer, is killed mid-way: the batches it held come back (a tokenizer's job batch is cut again
    into the same token batches), and every (document, chunk) is stored once, written once, and counted
    once, documents and chunks."""
    out, job = tmp_path / "c.npy", f"kill-{victim}-chunks" + ("-late" if late else "")
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(faults.docs.read_text().splitlines(keepends=True)[:CHUNKED]))
    chunking = ["--chunk-size", "48", "--chunk-overlap", "8", *(["--late-chunking"] if late else [])]
    proc = faults.reindex_to(job, "--out", str(out), *chunking, docs=docs)
    done = _wait_mid_job(faults, job, proc, CHUNKED)
    kill_and_replace(faults.services, victim, faults.start, lambda: _state(faults.nats.url, job).get("done", 0) > done)
    try:
        rc = proc.wait(300)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"job {job} did not finish\n{faults.logs()}") from None
    assert rc == 0, proc.stdout.read() + faults.logs()
    rows = [json.loads(line) for line in out.with_suffix(".chunks.jsonl").read_text().splitlines()]
    stored = asyncio.run(_stored_chunks(faults.nats.url, job))  # (document, chunk, its chunks) -> times stored
    assert set(stored.values()) == {1} and len(stored) == len(rows) > CHUNKED, Counter(stored.values())
    chunks_of = {d: n for d, _, n in stored}
    assert [(r["id"], r["chunk"]) for r in rows] == [
        (f"d{i}", k) for i in range(CHUNKED) for k in range(chunks_of[f"d{i}"])
    ]
    vectors = np.load(out)
    head = [r for r in rows if int(r["id"][1:]) < 12]  # the first documents' chunks (d7: several windows)
    if late:
        ref = Reference(model_info.path)
        want = np.concatenate(
            [
                ref.late_vectors(faults.texts[i], [(r["start"], r["end"]) for r in head if r["id"] == f"d{i}"], 254)
                for i in range(12)
            ]
        )  # 254: MiniLM's room
    else:
        want = reference.encode([faults.texts[int(r["id"][1:])][r["start"] : r["end"]] for r in head])
    assert cosines(vectors[: len(head)], want).min() >= COSINE_TOLERANCE
    state = _state(faults.nats.url, job)
    assert (state["status"], state["done"], state.get("failed", 0)) == ("done", CHUNKED, 0), state
    assert state["chunks"] == state["chunks_done"] == len(rows) and not state.get("chunks_failed"), state


async def _stored_chunks(url: str, job: str) -> Counter:
    nc = await nats.connect(url)
    try:
        return await stored_chunks(nc.jetstream(), SUBJECTS.results(job))
    finally:
        await nc.close()


def test_tokenizer_killed_mid_job(faults, reference, tmp_path):
    out = tmp_path / "v.npy"
    proc = faults.reindex("kill-tokenizer", out)
    _wait_mid_job(faults, "kill-tokenizer", proc)
    faults.services["tokenizer"].kill()
    state = _state(faults.nats.url, "kill-tokenizer")
    assert state["done"] < DOCUMENTS
    time.sleep(1.0)  # the outage itself: the job waits a while with no tokenizer (nothing to wait for)
    faults.start("tokenizer")
    _check_complete(faults, "kill-tokenizer", proc, out, reference)


def test_nats_server_restarted_mid_job(faults, reference, tmp_path):
    out = tmp_path / "v.npy"
    proc = faults.reindex("restart-nats", out)
    _wait_mid_job(faults, "restart-nats", proc)
    faults.nats.kill()  # SIGKILL: the store is recovered from disk on start
    time.sleep(1.0)  # the outage itself: every service sees its connection lost and retries meanwhile
    faults.nats.start()
    _check_complete(faults, "restart-nats", proc, out, reference)
    assert all(s.alive for s in faults.services.values()), faults.logs()


def _submit(url: str, job: str, texts: list[str], subjects: Subjects = SUBJECTS) -> None:
    """Publish a job the way the gateway does (no reindex process: no collector sets its status)."""

    async def publish() -> None:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            kv = await js.key_value(stream_names(subjects)["kv"])
            docs = [(f"{job}-{i}", t) for i, t in enumerate(texts)]
            await submit(js, kv, subjects, job, "all-MiniLM-L6-v2", docs, BATCH, EmbedOptions(), "test")
        finally:
            await nc.close()

    asyncio.run(publish())


def test_worker_killed_between_storing_and_counting(faults):
    """A worker that dies right after storing a result, before counting it: the batch comes back
    (after --ack-wait), is stored again as a duplicate and counted then, once. The workers alone
    bring the job to `done` with exact counts."""
    url, job, documents = faults.nats.url, "crash-count", 15 * BATCH
    crasher = Service(
        "worker",
        ["--nats", url, *HOLD, "--max-batch-tokens", "2048"],
        faults.folder,
        {"OMP_NUM_THREADS": "1", "EMBEDFLEET_TEST_CRASH_AFTER_STORE": "1"},
    )
    try:
        wait_until(lambda: count_services(url, "worker") == 3, 60, "the third worker", [crasher])
        _submit(url, job, faults.texts[:documents])
        wait_until(lambda: not crasher.alive, 60, "the worker's crash after its first store")
        assert crasher.proc.returncode == 70, crasher.log()[-2000:]
        wait_until(
            lambda: _state(url, job).get("status") != "running",
            60,
            "the job to settle",
            [faults.services["worker-1"], faults.services["worker-2"]],
        )
    finally:
        crasher.kill()
    state = _state(url, job)
    assert (state["status"], state["done"], state.get("failed", 0)) == ("done", documents, 0), state
    stored = _stored_ids(url, job)
    assert len(stored) == documents and set(stored.values()) == {1}, Counter(stored.values())


DRAIN = Subjects("drain")
DRAIN_DOCUMENTS = 360
DRAIN_WORKERS = 3


@dataclass
class DrainFleet:
    url: str
    folder: Path
    services: dict[str, Service]


@pytest.fixture
def drain_fleet(tmp_path) -> Iterator[DrainFleet]:
    """A nats-server, a tokenizer and three one-thread workers of their own, with the default
    --ack-wait (60 s): a batch a stopped worker left unacknowledged would stall a job for a minute.
    Two workers still keep the machine's two cores busy, so a job's time with one stopped measures
    stalls, not lost capacity."""
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    common = ["--nats", server.url, "--subject-prefix", DRAIN.prefix]
    fleet = {"tokenizer": Service("tokenizer", [*common, "--chunk-seqs", "16"], tmp_path)}
    for i in range(1, DRAIN_WORKERS + 1):
        fleet[f"worker-{i}"] = Service(
            "worker", [*common, "--max-batch-tokens", "2048"], tmp_path, {"OMP_NUM_THREADS": "1"}
        )
    try:
        wait_ready(fleet, server.url, prefix=DRAIN.prefix, timeout=120)
        yield DrainFleet(server.url, tmp_path, fleet)
    finally:
        for s in fleet.values():  # all told at once: they drain side by side
            if s.alive:
                s.proc.terminate()
        for s in fleet.values():
            s.stop()
        server.stop()


@pytest.mark.serial  # compares a job's times: with the machine to itself
def test_worker_stopped_mid_job_hands_over_without_a_stall(drain_fleet: DrainFleet):
    """SIGTERM to a worker mid-job: it stops fetching, hands back what it queued, finishes what
    runs, and exits within seconds; the job takes at most 1.5x the undisturbed run's time and 5 s (a
    batch left to wait out the 60 s ack wait would take it past 5x)."""
    url = drain_fleet.url
    docs = drain_fleet.folder / "drain.jsonl"
    docs.write_text(
        "".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(mixed_texts(DRAIN_DOCUMENTS)))
    )

    def run(job: str, stop: Service | None = None) -> tuple[float, float | None]:
        """The job's time from start to the reindex process's exit, and the stopped worker's exit time."""
        started = time.monotonic()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "embedfleet.services.cli",
                "reindex",
                str(docs),
                "--out",
                str(drain_fleet.folder / f"{job}.npy"),
                "--nats",
                url,
                "--subject-prefix",
                DRAIN.prefix,
                "--batch-size",
                str(BATCH),
                "--job-id",
                job,
                "--quiet",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        stopping = None
        if stop is not None:
            wait_until(
                lambda: _state(url, job, DRAIN).get("done", 0) >= 0.4 * DRAIN_DOCUMENTS or proc.poll() is not None,
                120,
                "the job mid-way",
            )
            assert proc.poll() is None, "the job ended before the worker was stopped: make it longer"
            t = time.monotonic()
            assert stop.stop() == 0, stop.log()[-3000:]
            stopping = time.monotonic() - t
        try:
            rc = proc.wait(180)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"job {job} did not finish") from None
        assert rc == 0, proc.stdout.read()
        return time.monotonic() - started, stopping

    undisturbed = min(run("drain-base-1")[0], run("drain-base-2")[0])
    disturbed, stopping = run("drain-stop", stop=drain_fleet.services["worker-2"])
    state = _state(url, "drain-stop", DRAIN)
    assert (state["status"], state["done"], state.get("failed", 0)) == ("done", DRAIN_DOCUMENTS, 0), state
    stored = _stored_ids(url, "drain-stop", DRAIN)
    assert len(stored) == DRAIN_DOCUMENTS and set(stored.values()) == {1}, Counter(stored.values())
    assert stopping < 10, f"the worker took {stopping:.1f}s to stop"
    print(f"undisturbed {undisturbed:.2f}s, a worker stopped mid-way {disturbed:.2f}s (its stop {stopping:.2f}s)")
    # a batch left unacknowledged would cost the 60 s ack wait; a loaded machine's noise a few seconds (9.1 s
    # after 5.9 s undisturbed in one loaded run)
    assert disturbed <= 1.5 * undisturbed + 5.0, (
        disturbed,
        undisturbed,
        drain_fleet.services["worker-2"].log()[-2000:],
    )
