"""A NATS node lost, and a quorum lost, under a running job: a real 3-node cluster on loopback ports
(the shipped nats-server), a tokenizer, a worker and a gateway holding every node's URL, online
requests sent throughout.

    python -m bench.cluster                      # the three faults below, figures printed and written
                                                 # to bench/results/cluster.json
    python -m bench.cluster --documents 2400 --quorum-pause 20

- node loss: the node leading every job stream and the job bucket, and serving the gateway's
  connection, killed a quarter into a job;
- node loss and restart: the same, the node started again two seconds later on its store;
- node stop and restart: the same node stopped with SIGTERM (as a rolling restart does), started
  again two seconds later;
- quorum loss: that node and a second killed; after ``--quorum-pause`` seconds one is started
  again (a quorum again), then the other.
Each time: how long the job made no progress, how long online requests went unanswered, what they
were answered, and whether every document was stored exactly once. tests/integration/test_cluster.py
runs the same scenarios and asserts on what they record.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx
import nats

from embedfleet.shared.jobs.bucket import read_state
from embedfleet.shared.jobs.state import JobState
from embedfleet.shared.jobs.streams import bucket_stream, stream_names
from embedfleet.shared.nats.server import EmbeddedNats, NatsCluster, find_binary, free_port
from embedfleet.shared.nats.subjects import Subjects
from tests.support.corpus import mixed_texts
from tests.support.procs import Service, count_services, healthy, stop_all, stored_doc_ids, wait_until

MODEL = "all-MiniLM-L6-v2"
SUBJECTS = Subjects("embedfleet")
BATCH = 16


@dataclass
class Reply:
    sent: float  # monotonic seconds
    seconds: float
    status: int | str  # the HTTP status, or the client's error
    why: str = ""  # a failed answer's message (what its client was told)


class Ticking(abc.ABC):
    """A daemon thread that runs ``_run`` from entering a ``with`` block until leaving it; ``_run``
    loops over ``_ticks()``, which ends once the block is left."""

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _ticks(self) -> Iterator[int]:
        """0, 1, 2, ..., ``interval`` seconds after each step ends, until the block is left."""
        i = 0
        while not self._stop.is_set():
            yield i
            i += 1
            self._stop.wait(self._interval)

    @abc.abstractmethod
    def _run(self) -> None:
        """The thread's work: a loop over ``_ticks()``."""


class Probe(Ticking):
    """Online embedding requests to the gateway, one after another ``interval`` apart, from a thread."""

    def __init__(self, base: str, interval: float = 0.05, timeout: float = 60.0) -> None:
        super().__init__(interval)
        self._base, self._timeout = base, timeout
        self.replies: list[Reply] = []

    def _run(self) -> None:
        with httpx.Client(timeout=self._timeout) as client:
            for i in self._ticks():
                sent = time.monotonic()
                status: int | str
                why = ""
                try:
                    answer = client.post(
                        f"{self._base}/v1/embeddings", json={"input": f"query {i} about failover", "model": MODEL}
                    )
                    status = answer.status_code
                    if status != 200:
                        why = answer.text[:200]
                except httpx.HTTPError as exc:
                    status, why = type(exc).__name__, str(exc)[:200]
                self.replies.append(Reply(sent, time.monotonic() - sent, status, why))


def longest_silence(replies: list[Reply], start: float, end: float) -> float:
    """The longest time in [start, end] with no request answered 200: the blip a client saw."""
    end = min(end, max((r.sent + r.seconds for r in replies), default=start))  # no later than the last answer
    done = sorted(r.sent + r.seconds for r in replies if r.status == 200 and start <= r.sent + r.seconds <= end)
    marks = [start, *done, end]
    return max(b - a for a, b in itertools.pairwise(marks))


class ClusterFleet:
    """A 3-node NATS cluster and a tokenizer, ``workers`` workers and a gateway, all given every node's URL."""

    def __init__(self, folder: Path, workers: int = 1, ack_wait: float = 4.0, request_timeout: float = 5.0) -> None:
        self.folder = folder
        self.cluster = NatsCluster(folder / "nats")
        self.request_timeout = request_timeout
        self._workers, self._ack_wait = workers, ack_wait
        self.services: list[Service] = []
        self.base = ""

    @property
    def url(self) -> str:
        return self.cluster.url

    def start(self) -> ClusterFleet:
        self.cluster.start()
        common = ["--nats", self.url, "--ack-wait", str(self._ack_wait)]
        self.services.append(Service("tokenizer", [*common, "--chunk-seqs", "16", "--bulk-ahead", "4"], self.folder))
        for _ in range(self._workers):
            self.services.append(
                Service("worker", [*common, "--max-batch-tokens", "2048"], self.folder, {"OMP_NUM_THREADS": "1"})
            )
        port = free_port()
        self.services.append(
            Service(
                "gateway",
                ["--nats", self.url, "--port", str(port), "--request-timeout", str(self.request_timeout)],
                self.folder,
            )
        )
        self.base = f"http://127.0.0.1:{port}"
        wait_until(
            lambda: healthy(self.base) and count_services(self.url, "worker") == self._workers,
            180,
            "the fleet on the cluster",
            self.services,
        )
        return self

    def stop(self) -> None:
        stop_all(self.services)  # side by side
        self.cluster.stop()

    def __enter__(self) -> ClusterFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {s.role}\n{s.log()[-2500:]}" for s in self.services)

    @property
    def live(self) -> list[EmbeddedNats]:
        return [n for n in self.cluster.nodes if n.running]

    def _run(self, work):
        async def main():
            async def quiet(exc: Exception) -> None:  # a node going away mid-read: the caller reads again
                pass

            nc = await nats.connect(
                [n.url for n in self.live], connect_timeout=2, max_reconnect_attempts=1, error_cb=quiet
            )
            try:
                return await work(nc, nc.jetstream(timeout=1.0))
            finally:
                await nc.close()

        return asyncio.run(main())

    def streams(self) -> list[str]:
        names = stream_names(SUBJECTS)
        return [names["jobs"], names["bulk"], names["results"], names["dead"], bucket_stream(SUBJECTS)]

    def placement(self) -> dict[str, tuple[int, str | None]]:
        """Each job stream's (replicas, leader)."""

        async def work(nc, js):
            out = {}
            for name in self.streams():
                info = await js.stream_info(name)
                out[name] = (info.config.num_replicas, info.cluster.leader if info.cluster else None)
            return out

        return self._run(work)

    def lead_from(self, node: str, timeout: float = 30.0) -> None:
        """Move the leadership of every job stream and the bucket to ``node`` (leader step-downs that
        prefer it)."""
        deadline = time.monotonic() + timeout

        async def led_elsewhere(js) -> list[str]:
            names = []
            for name in self.streams():
                try:
                    if (await js.stream_info(name)).cluster.leader != node:
                        names.append(name)
                except Exception:  # between leaders
                    names.append(name)
            return names

        async def work(nc, js):
            while others := await led_elsewhere(js):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{', '.join(others)} would not be led from {node}")
                preferred = json.dumps({"placement": {"preferred": node}}).encode()
                await asyncio.gather(
                    *(nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{name}", preferred, timeout=5) for name in others),
                    return_exceptions=True,
                )
                await asyncio.sleep(0.2)

        self._run(work)

    def node_of(self, connection: str) -> str:
        """The node the named connection (``embedfleet-gateway``, ...) is connected to."""
        for node in self.live:
            with urllib.request.urlopen(f"http://127.0.0.1:{node.monitor_port}/connz?limit=1000", timeout=5) as resp:
                if any(c.get("name") == connection for c in json.loads(resp.read()).get("connections", [])):
                    return node.name
        raise LookupError(f"no node serves {connection}")

    def state(self, job: str) -> JobState | None:
        async def work(nc, js):
            return await read_state(await js.key_value(stream_names(SUBJECTS)["kv"]), job)

        try:
            return self._run(work)
        except Exception:  # no quorum: the bucket does not answer
            return None

    def stored(self, job: str) -> Counter:
        """How many times each document id is stored in the job's results."""
        return self._run(lambda nc, js: stored_doc_ids(js, SUBJECTS.results(job)))

    def reindex(self, docs: Path, out: Path, job: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "embedfleet.services.cli",
                "reindex",
                str(docs),
                "--out",
                str(out),
                "--nats",
                self.url,
                "--batch-size",
                str(BATCH),
                "--job-id",
                job,
                "--quiet",
                "--stall-timeout",
                "120",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


def write_docs(folder: Path, documents: int) -> tuple[Path, list[str]]:
    texts = mixed_texts(documents)
    docs = folder / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return docs, texts


@dataclass
class Run:
    """What one job through one fault recorded."""

    job: str
    documents: int
    out: Path
    rc: int | None = None
    output: str = ""
    seconds: float = 0.0  # the job's, start to exit
    fault_at: float = 0.0  # monotonic
    progress: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, documents done)
    events: dict[str, float] = field(default_factory=dict)  # what happened when (monotonic)
    replies: list[Reply] = field(default_factory=list)
    stored: Counter = field(default_factory=Counter)

    def stall_after(self, moment: float) -> float:
        """Seconds from ``moment`` until the job's done count next grew."""
        before = max((d for t, d in self.progress if t <= moment), default=0)
        grew = [t for t, d in self.progress if t > moment and d > before]
        return (grew[0] - moment) if grew else float("inf")

    def summary(self) -> dict:
        online = [r for r in self.replies if r.sent >= self.fault_at]
        statuses = Counter(str(r.status) for r in online)
        window_end = self.fault_at + 15
        out = {
            "exit": self.rc,
            "job_seconds": round(self.seconds, 2),
            "documents": self.documents,
            "stored_once": len(self.stored) == self.documents and set(self.stored.values()) == {1},
            "job_stall_seconds": round(self.stall_after(self.fault_at), 2),
            "online_requests_after_fault": len(online),
            "online_statuses": dict(statuses),
            "online_longest_silence_seconds": round(longest_silence(self.replies, self.fault_at, window_end), 2),
            "online_slowest_seconds": round(max((r.seconds for r in online), default=0.0), 3),
        }
        for name, moment in self.events.items():
            out[f"{name}_after_fault_seconds"] = round(moment - self.fault_at, 2)
        return out


def _quarter(run: Run) -> int:
    return max(4 * BATCH, run.documents // 4)


class Sampler(Ticking):
    """Reads the job's done count every 50 ms from a thread while the job runs (nothing while the
    bucket has no quorum), into ``run.progress``."""

    def __init__(self, fleet: ClusterFleet, run: Run) -> None:
        super().__init__(0.05)
        self._fleet, self._job_run = fleet, run

    def _run(self) -> None:
        for _ in self._ticks():
            state = self._fleet.state(self._job_run.job)
            if state is not None:
                self._job_run.progress.append((time.monotonic(), state.done))

    def wait(self, until, timeout: float, proc: subprocess.Popen[str]) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if until(self._job_run):
                return True
            time.sleep(0.02)
        return until(self._job_run)


def _quarter_done(run: Run) -> bool:
    return bool(run.progress) and run.progress[-1][1] >= _quarter(run)


def _start(fleet: ClusterFleet, docs: Path, run: Run, sampler: Sampler) -> subprocess.Popen[str]:
    proc = fleet.reindex(docs, run.out, run.job)
    if not sampler.wait(_quarter_done, 180, proc):
        raise RuntimeError(f"job {run.job} did not get a quarter done: {proc.poll()}\n{fleet.logs()}")
    return proc


def _finish(fleet: ClusterFleet, run: Run, proc: subprocess.Popen[str], started: float, timeout: float = 240) -> Run:
    try:
        run.rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    run.seconds = time.monotonic() - started
    assert proc.stdout is not None  # piped by reindex
    run.output = proc.stdout.read()
    fleet.cluster.wait_healthy(60)
    run.stored = fleet.stored(run.job)
    return run


def node_loss(
    fleet: ClusterFleet,
    docs: Path,
    documents: int,
    job: str,
    restart_after: float | None = None,
    graceful: bool = False,
) -> Run:
    """Kill the node that leads every job stream and serves the gateway, a quarter into the job
    (and start it again ``restart_after`` seconds later). ``graceful``: stopped with SIGTERM, as a
    rolling restart does, rather than killed."""
    victim = fleet.node_of("embedfleet-gateway")
    fleet.lead_from(victim)
    run = Run(job, documents, fleet.folder / f"{job}.npy")
    node = fleet.cluster.node(victim)
    with Probe(fleet.base) as probe, Sampler(fleet, run) as sampler:
        started = time.monotonic()
        proc = _start(fleet, docs, run, sampler)
        run.fault_at = time.monotonic()
        node.stop() if graceful else node.kill()
        if graceful:
            run.events["stopped"] = time.monotonic()
        if restart_after is not None:
            time.sleep(max(0.0, run.fault_at + restart_after - time.monotonic()))
            node.start()
            run.events["restarted"] = time.monotonic()
            fleet.cluster.wait_healthy(60)
            run.events["caught_up"] = time.monotonic()
        _finish(fleet, run, proc, started)
        run.replies = list(probe.replies)
    if restart_after is None:
        node.start()  # the cluster whole again for what follows
        fleet.cluster.wait_healthy(60)
    return run


def quorum_loss(fleet: ClusterFleet, docs: Path, documents: int, job: str, pause: float) -> Run:
    """Kill two of the three nodes a quarter into the job; ``pause`` seconds later start one again
    (a quorum again), then the other once the job moves."""
    first = fleet.node_of("embedfleet-gateway")
    fleet.lead_from(first)
    second = next(n.name for n in fleet.cluster.nodes if n.name != first)
    run = Run(job, documents, fleet.folder / f"{job}.npy")
    with Probe(fleet.base) as probe, Sampler(fleet, run) as sampler:
        started = time.monotonic()
        proc = _start(fleet, docs, run, sampler)
        fleet.cluster.node(first).kill()
        fleet.cluster.node(second).kill()
        run.fault_at = time.monotonic()
        time.sleep(pause)
        fleet.cluster.node(second).start()
        back = run.events["quorum_back"] = time.monotonic()
        sampler.wait(lambda r: r.stall_after(back) < float("inf"), 120, proc)
        fleet.cluster.node(first).start()
        run.events["all_back"] = time.monotonic()
        _finish(fleet, run, proc, started)
        run.replies = list(probe.replies)
    return run


def message_sizes(texts: list[str], batch: int = 64) -> dict[str, float]:
    """Bytes per document of each message a job makes, encoded as the services encode them: job
    batches of ``batch`` documents, token batches as the tokenizer packs them, results in three forms
    of the model's 384 components."""
    from embedfleet.services.tokenizer.encoder import TextEncoder, pack_chunks
    from embedfleet.shared.model_dir.load import load_model_info
    from embedfleet.shared.protocol import EmbedOptions, JobBatch, JobResult, TokenChunk, encode

    ids = [f"d{i}" for i in range(len(texts))]
    job = sum(
        len(encode(JobBatch("job", i, MODEL, ids[i : i + batch], texts[i : i + batch], EmbedOptions())))
        for i in range(0, len(texts), batch)
    )
    tokens = TextEncoder(load_model_info(None)).encode(texts, True)
    packed = sum(
        len(
            encode(
                TokenChunk(
                    id="job.0",
                    model=MODEL,
                    start=c.start,
                    total=len(texts),
                    input_ids=c.input_ids,
                    cu_seqlens=c.cu_seqlens,
                    deadline=time.time(),
                    options=EmbedOptions(),
                    job="job",
                    batch=0,
                    doc_ids=ids[c.start : c.start + len(c.cu_seqlens) - 1],
                    prompt_tokens=0,
                )
            )
        )
        for c in pack_chunks(tokens, 2048, 256)
    )
    out = {
        "text": sum(len(t.encode()) for t in texts) / len(texts),
        "tokens": sum(map(len, tokens)) / len(texts),
        "job_batch": job / len(texts),
        "token_batch": packed / len(texts),
    }
    for name, dtype, width in (
        ("result_float32", "f4", 384 * 4),
        ("result_int8", "i1", 384),
        ("result_binary", "b1", 48),
    ):
        out[name] = len(encode(JobResult("job", 0, 0, ids[:16], 384, dtype, b"\0" * width * 16, 1000))) / 16
    return {k: round(v, 1) for k, v in out.items()}


def results_bytes(fleet: ClusterFleet, job: str) -> dict[str, float]:
    """What the results stream holds on disk for ``job``, per document: payload and the store's framing."""

    async def work(nc, js):
        info = await js.stream_info(stream_names(SUBJECTS)["results"])
        return info.state.bytes, info.state.messages

    return dict(zip(("bytes", "messages"), fleet._run(work)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=1200)
    parser.add_argument("--quorum-pause", type=float, default=10.0, help="seconds two of the three nodes stay down")
    parser.add_argument("--out", default="bench/results/cluster.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ClusterFleet(Path(tmp)) as fleet:
        docs, texts = write_docs(Path(tmp), args.documents)
        clean_start = time.monotonic()
        clean = fleet.reindex(docs, Path(tmp) / "clean.npy", "clean")
        clean_rc = clean.wait(600)
        results: dict[str, Any] = {"clean": {"exit": clean_rc, "job_seconds": round(time.monotonic() - clean_start, 2)}}
        stored = results_bytes(fleet, "clean")  # the clean job is the only one in the stream yet
        results["sizes_bytes_per_document"] = {
            **message_sizes(texts),
            "results_stream_float32": round(stored["bytes"] / args.documents, 1),
            "results_messages": stored["messages"],
        }
        results["node_loss"] = node_loss(fleet, docs, args.documents, "node-loss").summary()
        results["node_loss_restart"] = node_loss(
            fleet, docs, args.documents, "node-restart", restart_after=2.0
        ).summary()
        results["node_stop_restart"] = node_loss(
            fleet, docs, args.documents, "node-stop", restart_after=2.0, graceful=True
        ).summary()
        results["quorum_loss"] = quorum_loss(fleet, docs, args.documents, "quorum-loss", args.quorum_pause).summary()
        results["replicas"] = {name: r for name, (r, _) in fleet.placement().items()}
    version = subprocess.run([find_binary(), "--version"], capture_output=True, text=True).stdout.strip()
    results["setup"] = {
        "documents": args.documents,
        "batch": BATCH,
        "quorum_pause_seconds": args.quorum_pause,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "nats_server": version,
    }
    print(json.dumps(results, indent=2))
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
