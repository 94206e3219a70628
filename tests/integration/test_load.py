"""Bounded load tests on real processes: far more work than the stack can serve.

The gateway admits ``--max-in-flight`` requests and answers the rest 429 at once, so memory does not
grow with the offered load: every request gets an answer (200 or 429, nothing else, no client
timeout), each service's resident memory stays flat over the run, and when the load stops the
stack answers a plain request at once. ``EMBEDFLEET_LOAD_SECONDS`` sets the length (default 12).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from embedfleet.shared.nats.server import EmbeddedNats, free_port
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import ErrorReply, TokenChunk, decode, encode
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import medium_texts
from tests.support.procs import Service, healthy, wait_until

# offers six times the admitted load and watches memory: with the machine to itself
pytestmark = [pytest.mark.integration, pytest.mark.serial]

MODEL = "all-MiniLM-L6-v2"
SECONDS = float(os.environ.get("EMBEDFLEET_LOAD_SECONDS", "12"))
MAX_IN_FLIGHT = 16
QUEUE_LIMIT = 16384  # the worker's --max-queued-tokens
CLIENTS = 96  # connections sending back to back: several times what MAX_IN_FLIGHT admits
TEXTS = medium_texts(64)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> Iterator[tuple[str, str, dict[str, Service]]]:
    folder = tmp_path_factory.mktemp("load")
    server = EmbeddedNats(folder / "nats")
    server.start()
    port = free_port()
    common = ["--nats", server.url]
    services = {
        "tokenizer": Service("tokenizer", common, folder),
        "worker": Service(
            "worker", [*common, "--max-batch-tokens", "1024", "--max-queued-tokens", str(QUEUE_LIMIT)], folder
        ),
        "gateway": Service(
            "gateway",
            [*common, "--port", str(port), "--max-in-flight", str(MAX_IN_FLIGHT), "--request-timeout", "30"],
            folder,
        ),
    }
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthy(base_url), 120, "gateway health", list(services.values()))
        yield base_url, server.url, services
    finally:
        for s in services.values():
            s.stop()
        server.stop()


async def offer_load(base_url: str, seconds: float, services: dict[str, Service]) -> tuple[Counter, list[str], dict]:
    statuses: Counter = Counter()
    failures: list[str] = []
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in services}
    end = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)

    async def client(k: int, http: httpx.AsyncClient) -> None:
        i = k
        while time.monotonic() < end:
            size = 1 + (i * 7) % 16
            first = (i * 5) % (len(TEXTS) - size)
            try:
                r = await http.post("/v1/embeddings", json={"model": MODEL, "input": TEXTS[first : first + size]})
                statuses[r.status_code] += 1
                if r.status_code == 429:
                    assert r.json()["error"]["type"], r.text  # the API's own error shape
                    await asyncio.sleep(0.01)  # pacing: a refused client backs off a little, as a real one would
                elif r.status_code != 200:
                    failures.append(f"{r.status_code}: {r.text[:200]}")
            except httpx.HTTPError as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
            i += CLIENTS

    async def sample() -> None:
        started = time.monotonic()
        while time.monotonic() < end:
            for name, s in services.items():
                samples[name].append((time.monotonic() - started, rss_mb(s.proc.pid)))
            await asyncio.sleep(1.0)  # pacing: one memory sample a second

    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as http:
        await asyncio.gather(sample(), *(client(k, http) for k in range(CLIENTS)))
    return statuses, failures, samples


def test_overload_answers_429_and_memory_stays_flat(loaded, reference):
    base_url, _, services = loaded
    httpx.post(f"{base_url}/v1/embeddings", json={"model": MODEL, "input": TEXTS}, timeout=60).raise_for_status()
    statuses, failures, samples = asyncio.run(offer_load(base_url, SECONDS, services))
    report = f"statuses {dict(statuses)}; failures {failures[:5]}; rss " + ", ".join(
        f"{name} {s[0][1]:.0f}->{max(v for _, v in s):.0f} MB" for name, s in samples.items()
    )
    print(report)
    assert not failures, report
    assert statuses[200] > 0 and statuses[429] > statuses[200], report  # most of the offered load is refused
    assert set(statuses) <= {200, 429}, report
    for name, series in samples.items():
        quarter = max(1, len(series) // 4)
        early = max(v for _, v in series[:quarter])
        late = max(v for _, v in series[-quarter:])
        # no growth with time: the last quarter's peak within 10% (+25 MB of allocator noise) of the first's
        assert late <= early * 1.10 + 25, f"{name} grew from {early:.0f} to {late:.0f} MB; {report}"
    for s in services.values():
        assert s.alive, s.log()[-2000:]
    # the load gone, the stack answers at once, and right
    started = time.monotonic()
    r = httpx.post(f"{base_url}/v1/embeddings", json={"model": MODEL, "input": TEXTS[:4]}, timeout=30)
    assert r.status_code == 200 and time.monotonic() - started < 5
    got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
    assert cosines(got, reference.encode(TEXTS[:4])).min() >= COSINE_TOLERANCE
    metrics = httpx.get(f"{base_url}/metrics", timeout=10).text
    in_flight = [line for line in metrics.splitlines() if line.startswith("embedfleet_requests_in_flight")]
    assert in_flight and float(in_flight[0].split()[-1]) == 0.0, in_flight


def test_a_worker_flooded_over_nats_refuses_past_its_queue_limit(loaded):
    """Token batches straight to the worker, far faster than it computes (as many gateways and
    tokenizers could send): past --max-queued-tokens it answers 'overloaded' at once instead of
    queueing without bound; every batch gets an answer, and the worker keeps serving."""
    base_url, nats_url, services = loaded
    worker = services["worker"]
    rows, length, batches = 8, 32, 400  # 102,400 tokens offered at once; the limit is QUEUE_LIMIT

    async def flood() -> Counter:
        import nats as nats_client

        nc = await nats_client.connect(nats_url)
        answers: Counter = Counter()
        done = asyncio.Event()

        async def on_reply(msg) -> None:
            reply = decode(msg.data)
            answers[reply.code.value if isinstance(reply, ErrorReply) else type(reply).__name__] += 1
            if sum(answers.values()) == batches:
                done.set()

        inbox = nc.new_inbox()
        await nc.subscribe(f"{inbox}.*", cb=on_reply)
        ids = np.tile(np.array([101] + [2000 + k for k in range(length - 2)] + [102], np.int32), rows)
        cu = np.arange(0, rows * length + 1, length, dtype=np.int32)
        for i in range(batches):
            batch = TokenChunk(f"flood{i}", MODEL, 0, rows, ids, cu, time.time() + 120)
            await nc.publish(Subjects().tokens(MODEL), encode(batch), reply=f"{inbox}.{i}")
        await nc.flush()
        try:
            await asyncio.wait_for(done.wait(), 120)
        finally:
            await nc.close()
        return answers

    before = rss_mb(worker.proc.pid)
    answers = asyncio.run(flood())
    assert sum(answers.values()) == batches, answers
    assert answers["overloaded"] > 0 and answers["EmbedResult"] > 0, answers
    assert set(answers) <= {"overloaded", "EmbedResult"}, answers
    assert answers["EmbedResult"] * rows * length <= 2 * QUEUE_LIMIT, answers  # refused at once, not queued
    assert worker.alive and rss_mb(worker.proc.pid) < before + 200
    r = httpx.post(f"{base_url}/v1/embeddings", json={"model": MODEL, "input": TEXTS[:2]}, timeout=30)
    assert r.status_code == 200, r.text
