"""The stack under test: real nats-server, and tokenizer, two workers, scorer and gateway as processes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from embedfleet.shared.nats.server import free_port
from tests.support.procs import Service, running
from tests.support.role_images import role_env

# small chunks, so that ordinary requests are split and spread across both workers
CHUNK_ARGS = ["--chunk-seqs", "16", "--chunk-tokens", "1024"]


@dataclass
class Stack:
    nats_url: str
    base_url: str
    services: dict[str, Service]


@pytest.fixture(scope="session")
def stack(nats_url: str, tmp_path_factory) -> Iterator[Stack]:
    log_dir = tmp_path_factory.mktemp("logs")
    port = free_port()
    common = ["--nats", nats_url]
    # a fixed budget here; `embedfleet up` (test_up) runs the start-up calibration
    budget = ["--max-batch-tokens", "2048"]
    # one torch thread per worker: two workers share the machine's cores
    single = {"OMP_NUM_THREADS": "1"}
    # each process as its role's image holds it: the packages only other roles' images install refused at
    # import (no torch outside the workers, no starlette outside the gateway)
    services = {
        "tokenizer": Service("tokenizer", [*common, *CHUNK_ARGS], log_dir, role_env("tokenizer")),
        "worker-1": Service("worker", [*common, *budget], log_dir, {**single, **role_env("worker")}),
        "worker-2": Service("worker", [*common, *budget], log_dir, {**single, **role_env("worker")}),
        "scorer": Service("scorer", common, log_dir, role_env("scorer")),
        # `make test` runs three pytest processes, each with its processes, on two cores: a request of
        # hundreds of texts can take past the default 30 s deadline there (deadlines are tested on
        # gateways of their own)
        "gateway": Service(
            "gateway", [*common, "--port", str(port), "--request-timeout", "120"], log_dir, role_env("gateway")
        ),
    }
    base_url = f"http://127.0.0.1:{port}"
    with running(services, nats_url, base_url):
        yield Stack(nats_url, base_url, services)
