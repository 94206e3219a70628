"""Lifecycle on real processes: services reconnect after a NATS restart; SIGTERM drains in-flight work."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from embedfleet.services.gateway.http.health_answers import Unhealthy
from embedfleet.shared.nats.server import EmbeddedNats, free_port
from tests.support.corpus import medium_texts
from tests.support.procs import Service, count_services, healthy, holds_rows, wait_until

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"


@dataclass
class SmallStack:
    nats: EmbeddedNats
    base_url: str
    services: dict[str, Service]
    data_dir: Path
    worker_metrics: int  # the worker's --metrics-port


@pytest.fixture
def small_stack(tmp_path) -> Iterator[SmallStack]:
    nats = EmbeddedNats(tmp_path / "nats")
    nats.start()
    port, metrics_port = free_port(), free_port()
    common = ["--nats", nats.url]
    services = {
        "tokenizer": Service("tokenizer", [*common, "--chunk-seqs", "32"], tmp_path),
        "worker": Service(
            "worker", [*common, "--max-batch-tokens", "1024", "--metrics-port", str(metrics_port)], tmp_path
        ),
        "gateway": Service("gateway", [*common, "--port", str(port), "--request-timeout", "120"], tmp_path),
    }
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthy(base_url), 120, "gateway health", list(services.values()))
        yield SmallStack(nats, base_url, services, tmp_path / "nats", metrics_port)
    finally:
        for s in services.values():
            s.stop()
        nats.stop()


def _embed(base_url: str, texts: list[str], timeout: float = 60) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/embeddings", json={"model": MODEL, "input": texts}, timeout=timeout)


def test_services_reconnect_after_nats_restart(small_stack, reference):
    before = _embed(small_stack.base_url, ["before the restart"])
    assert before.status_code == 200
    small_stack.nats.stop()
    down = httpx.get(f"{small_stack.base_url}/health", timeout=10)
    assert down.status_code == 503 and down.json()["error_type"] == "Unhealthy"
    Unhealthy.model_validate_json(down.content)  # the answer is its documented model, strictly
    restarted = EmbeddedNats(small_stack.data_dir, port=small_stack.nats.port)
    restarted.start()
    try:
        wait_until(
            lambda: healthy(small_stack.base_url),
            60,
            "health after the NATS restart",
            list(small_stack.services.values()),
        )
        texts = ["after the restart", "still the same vectors"]
        r = _embed(small_stack.base_url, texts)
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
        np.testing.assert_allclose(got, reference.encode(texts), atol=1e-4)
    finally:
        restarted.stop()


def test_sigterm_drains_in_flight_work(small_stack):
    texts = medium_texts(240)  # ~12k tokens: seconds of work on a CPU
    result: dict[str, httpx.Response] = {}
    thread = threading.Thread(target=lambda: result.setdefault("r", _embed(small_stack.base_url, texts, 120)))
    thread.start()
    worker = small_stack.services["worker"]
    wait_until(
        lambda: holds_rows(small_stack.worker_metrics, MODEL) or not thread.is_alive(),
        60,
        "the request's rows queued in the worker",
        [worker],
    )
    assert thread.is_alive() and worker.alive, "the request finished before the worker was stopped"
    assert worker.stop(timeout=120) == 0, worker.log()[-2000:]
    thread.join(120)
    r = result["r"]
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == len(texts)


def test_ready_file_marks_a_serving_service(tmp_path, nats_url):
    """The readiness probes' file: written once the service serves, removed when it stops."""
    ready = tmp_path / "ready"
    tokenizer = Service(
        "tokenizer", ["--nats", nats_url, "--subject-prefix", "readyprobe", "--ready-file", str(ready)], tmp_path
    )
    try:
        wait_until(ready.exists, 60, "the ready file", [tokenizer])
        assert count_services(nats_url, "tokenizer", prefix="readyprobe") == 1  # ready means it answers
        assert ready.read_text().strip() == str(tokenizer.proc.pid)
    finally:
        assert tokenizer.stop() == 0
    assert not ready.exists()


def test_init_creates_the_streams(nats_url):
    import asyncio
    import subprocess
    import sys

    import nats as nats_client

    from embedfleet.shared.jobs.streams import stream_names
    from embedfleet.shared.nats.subjects import Subjects

    for _ in range(2):  # idempotent
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "embedfleet.services.cli",
                "init",
                "--nats",
                nats_url,
                "--subject-prefix",
                "initcheck",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
    names = stream_names(Subjects("initcheck"))

    async def check() -> None:
        nc = await nats_client.connect(nats_url)
        js = nc.jetstream()
        for key in ("jobs", "bulk", "results", "dead"):
            assert (await js.stream_info(names[key])).config.name == names[key]
        await js.key_value(names["kv"])
        await nc.close()

    asyncio.run(check())
