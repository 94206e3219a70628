"""A stack of one tokenizer, worker, scorer and gateway, each serving its Prometheus metrics on a free
port of its own (--metrics-port), on subjects under a prefix of its own (no other test's streams)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx

from embedfleet.services.up.launch import FreePorts
from tests.support.procs import Service, running

MODEL = "all-MiniLM-L6-v2"
ROLES = ("tokenizer", "worker", "scorer", "gateway")


class Fleet:
    def __init__(self, base_url: str, ports: dict[str, int], services: dict[str, Service]) -> None:
        self.base_url, self.ports, self.services = base_url, ports, services

    def scrape(self, role: str) -> str:
        r = httpx.get(f"http://127.0.0.1:{self.ports[role]}/metrics", timeout=10)
        assert r.status_code == 200, r.text
        return r.text


@contextlib.contextmanager
def metrics_fleet(
    nats_url: str, prefix: str, log_dir: Path, extra: dict[str, list[str]] | None = None
) -> Iterator[Fleet]:
    """The fleet once the gateway is healthy and its processes answer; ``extra``: more arguments by role."""
    extra = extra or {}
    with contextlib.closing(FreePorts("127.0.0.1")) as free:
        ports = {role: free(1) for role in ROLES}
        http_port = free(1)
    common = ["--nats", nats_url, "--subject-prefix", prefix]
    args = {role: [*common, "--metrics-port", str(ports[role]), *extra.get(role, [])] for role in ROLES}
    services = {
        "tokenizer": Service("tokenizer", args["tokenizer"], log_dir),
        "worker": Service("worker", ["--max-batch-tokens", "1024", *args["worker"]], log_dir, {"OMP_NUM_THREADS": "1"}),
        "scorer": Service("scorer", args["scorer"], log_dir),
        "gateway": Service("gateway", ["--port", str(http_port), *args["gateway"]], log_dir),
    }
    base_url = f"http://127.0.0.1:{http_port}"
    with running(services, nats_url, base_url, prefix=prefix):
        yield Fleet(base_url, ports, services)
