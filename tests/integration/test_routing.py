"""Load-aware routing on real processes: both workers are used, and losing one loses no request."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import nats
import pytest

from embedfleet.shared.config.registry import default
from embedfleet.shared.nats.server import EmbeddedNats, free_port
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import LoadReport, decode
from tests.support.corpus import medium_texts
from tests.support.procs import Service, count_services, healthy, wait_until

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"


def _load_reporters(url: str, seconds: float = 1.5 * default("load_idle_interval")) -> dict[str, float]:
    """The workers that report their load within ``seconds`` (an idle one reports every
    --load-idle-interval): id -> their report interval."""

    async def listen() -> dict[str, float]:
        nc = await nats.connect(url)
        seen: dict[str, float] = {}

        async def on_report(msg) -> None:
            report = decode(msg.data)
            if isinstance(report, LoadReport) and not report.leaving:
                seen[report.id] = report.interval

        await nc.subscribe(Subjects().load(MODEL), cb=on_report)
        await asyncio.sleep(seconds)
        await nc.close()
        return seen

    return asyncio.run(listen())


def _embed_all(base: str, batches: list[list[str]]) -> list[int]:
    return [
        httpx.post(f"{base}/v1/embeddings", json={"model": MODEL, "input": b}, timeout=60).status_code for b in batches
    ]


def test_routing_survives_workers_leaving(tmp_path):
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    port = free_port()
    common = ["--nats", server.url]
    worker_args = [*common, "--max-batch-tokens", "512", "--threads", "1"]
    services = {
        "tokenizer": Service("tokenizer", [*common, "--chunk-seqs", "8", "--routing", "load"], tmp_path),
        "w1": Service("worker", worker_args, tmp_path),
        "w2": Service("worker", worker_args, tmp_path),
        "gateway": Service("gateway", [*common, "--port", str(port)], tmp_path),
    }
    base = f"http://127.0.0.1:{port}"
    texts = medium_texts(64)
    try:
        wait_until(
            lambda: healthy(base) and count_services(server.url, "worker") == 2,
            120,
            "the stack",
            list(services.values()),
        )
        assert len(_load_reporters(server.url)) == 2  # both workers report their queue depth
        assert _embed_all(base, [texts] * 3) == [200] * 3

        # a worker stopping gracefully says so first: requests sent meanwhile are all answered
        statuses: list[int] = []
        sender = threading.Thread(target=lambda: [statuses.extend(_embed_all(base, [texts[:16]])) for _ in range(12)])
        sender.start()
        wait_until(lambda: len(statuses) >= 2, 60, "requests answered before the stop", list(services.values()))
        assert sender.is_alive(), "every request was answered before the worker stopped"
        assert services["w2"].stop() == 0
        sender.join(120)
        assert statuses == [200] * 12

        # a worker killed outright: requests sent at once, while its last load reports are fresh and the
        # tokenizer still picks it, reach no one there; the tokenizer's delivery check finds that at once
        # and sends the batches to the live worker
        services["w3"] = Service("worker", worker_args, tmp_path)
        wait_until(lambda: len(_load_reporters(server.url)) == 2, 90, "a new worker", list(services.values())[:1])
        services["w3"].kill()
        started = time.monotonic()
        assert _embed_all(base, [texts[:16]] * 10) == [200] * 10
        assert time.monotonic() - started < 30
        assert "is gone; its " in services["tokenizer"].log(), services["tokenizer"].log()[-3000:]
        assert len(_load_reporters(server.url)) == 1
    finally:
        for s in services.values():
            s.stop()
        server.stop()
