"""A worker stopped (SIGSTOP) while it looks live to the tokenizer, on real processes and a real nats-server.

An idle worker's load reports come every --load-idle-interval seconds, and the tokenizer drops a silent
worker only after three of them: for that while it still routes batches to it, and a stopped worker
looks the least loaded of all. The gateway takes it for lost after three silent pings; from then on
each request names it for the tokenizer to pass over, so requests are served by the other worker
instead of waiting for their deadline, until it answers again.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import numpy as np
import pytest

from embedfleet.shared.nats.server import EmbeddedNats, free_port
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import medium_texts
from tests.support.procs import Service, running, scraped, wait_until

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"
DEADLINE = 20.0  # the gateway's --request-timeout
TEXTS = medium_texts(64)  # spread over both workers: 8 texts a tokenizer chunk
IDLE_REPORTS = (
    60.0  # the workers' --load-idle-interval: a stopped idle worker looks live to the tokenizer for 3 minutes
)


@dataclass
class Stack:
    base_url: str
    gateway: Service
    workers: list[Service]
    metrics: list[int]  # the workers' metrics ports

    def rows(self, worker: int) -> float:
        return scraped(self.metrics[worker], "embedfleet_worker_rows_total", model=MODEL, queue="online")


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("stopped-worker")
    server = EmbeddedNats(folder / "nats")
    server.start()
    common = ["--nats", server.url]
    port, metrics = free_port(), [free_port(), free_port()]
    workers = [
        Service(
            "worker",
            [*common, "--max-batch-tokens", "512", "--load-idle-interval", str(IDLE_REPORTS), "--metrics-port", str(m)],
            folder,
            {"OMP_NUM_THREADS": "1"},
        )
        for m in metrics
    ]
    gateway = Service(
        "gateway",
        [*common, "--port", str(port), "--request-timeout", str(DEADLINE), "--discovery-interval", "0.3"],
        folder,
    )
    tokenizer = Service("tokenizer", [*common, "--chunk-seqs", "8"], folder)
    base_url = f"http://127.0.0.1:{port}"
    try:
        with running([tokenizer, *workers, gateway], server.url, base_url):
            yield Stack(base_url, gateway, workers, metrics)
    finally:
        server.stop()


def _embed(base_url: str) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    r = httpx.post(f"{base_url}/v1/embeddings", json={"model": MODEL, "input": TEXTS}, timeout=DEADLINE + 10)
    return r, time.monotonic() - started


def _check(r: httpx.Response, expected: np.ndarray, stack: Stack) -> None:
    assert r.status_code == 200, f"{r.status_code} {r.text[:300]}\n{stack.gateway.log()[-3000:]}"
    got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
    assert cosines(got, expected).min() >= 1 - COSINE_TOLERANCE


def test_a_stopped_idle_worker_the_tokenizer_still_routes_to_is_passed_over_until_it_answers_again(stack, reference):
    expected = reference.encode(TEXTS)
    r, _ = _embed(stack.base_url)
    _check(r, expected, stack)
    assert stack.rows(0) > 0 and stack.rows(1) > 0, "one request is spread over both workers"
    stopped = stack.workers[1].proc.pid
    os.kill(stopped, signal.SIGSTOP)
    try:
        # the gateway, idle, pings every fifth discovery interval: silent for three pings, the worker is lost
        wait_until(lambda: "stopped answering" in stack.gateway.log(), 30, "the gateway to take worker 2 for lost")
        for _ in range(3):  # the tokenizer's view still has worker 2 idle: it would take half of each request
            r, took = _embed(stack.base_url)
            _check(r, expected, stack)
            assert took < DEADLINE / 2, took
    finally:
        os.kill(stopped, signal.SIGCONT)
    # answering again, it is no longer passed over: requests reach it
    before = stack.rows(1)
    wait_until(lambda: _embed(stack.base_url)[0].status_code == 200 and stack.rows(1) > before, 30, "worker 2 to serve")
