"""Worker replicas: several engines in one worker (the CUDA layout, run here on CPU threads), and
CPU replicas as processes sharing the cores."""

from __future__ import annotations

import asyncio

import nats
import numpy as np
import pytest

from embedfleet.services.gpu_worker.config import WorkerConfig
from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.service import WorkerService
from embedfleet.services.tokenizer.config import TokenizerConfig
from embedfleet.services.tokenizer.service import TokenizerService
from embedfleet.shared.nats.config import NatsConfig
from embedfleet.shared.nats.embed_client import EmbedClient
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import EmbedOptions
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import mixed_texts
from tests.support.procs import Service, count_services, wait_until

pytestmark = pytest.mark.integration


def test_two_engine_replicas_in_one_worker(nats_url, model_info, reference):
    subjects = Subjects("replicas")
    nats_cfg = NatsConfig(nats_url, subjects)
    worker_cfg = WorkerConfig(
        nats=nats_cfg,
        model=model_info,
        device="cpu",
        dtype=None,
        max_batch_tokens=512,
        max_batch_seqs=8,
        replicas=2,
        threads=None,
        graphs=False,
        attention="auto",
    )
    first = Engine(model_info, "cpu", max_batch_tokens=512, max_batch_seqs=8)
    engines = [first, first.replicate()]
    texts = mixed_texts(120)

    async def run() -> np.ndarray:
        nc = await nats.connect(nats_url)
        tokenizer = TokenizerService(nc, TokenizerConfig(nats_cfg, model_info, chunk_tokens=4096, chunk_seqs=64))
        worker = WorkerService(nc, worker_cfg, engines)
        await tokenizer.start()
        await worker.start()
        client = EmbedClient(nc, subjects)
        await client.start()
        try:
            outcomes = await asyncio.gather(
                *(client.embed(model_info.id, texts[i : i + 30], EmbedOptions(), 60) for i in range(0, 120, 30))
            )
            return np.concatenate([o.vectors for o in outcomes])
        finally:
            await worker.stop()
            await tokenizer.stop()
            await nc.close()

    got = asyncio.run(run())
    c = cosines(got, reference.encode(texts))
    assert c.min() >= COSINE_TOLERANCE, c.min()


def test_cpu_replicas_run_as_processes(nats_url, tmp_path):
    import contextlib

    import httpx

    from embedfleet.services.up.launch import FreePorts

    prefix = "cpuprocs"
    with contextlib.closing(FreePorts("127.0.0.1")) as free:
        metrics_port = free(2)
    worker = Service(
        "worker",
        [
            "--nats",
            nats_url,
            "--subject-prefix",
            prefix,
            "--replicas",
            "2",
            "--max-batch-tokens",
            "512",
            "--metrics-port",
            str(metrics_port),
        ],
        tmp_path,
    )
    try:
        wait_until(lambda: count_services(nats_url, "worker", prefix=prefix) == 2, 90, "two worker processes", [worker])
        # --metrics-port P: the i-th replica process serves its metrics on P + i
        for port in (metrics_port, metrics_port + 1):
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            assert "embedfleet_worker_max_batch_tokens" in text and 'queue="online"' in text
    finally:
        code = worker.stop()
    assert code == 0, worker.log()[-2000:]
    assert worker.log().count("worker stopped") == 2
