"""Fleet benchmarks on real processes (nats-server, tokenizer, workers, gateway), ratios in one run.

python -m bench.fleet tokenizer   # one tokenizer's tokens/s on the long workload, and the share
                                  # of end-to-end time spent tokenizing
python -m bench.fleet scaling     # a request of thousands of inputs: one worker against two
python -m bench.fleet routing     # two workers, one slowed by a CPU hog on its core: single-query
                                  # p50/p99 with load-aware routing against the plain queue group
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.nats.server import EmbeddedNats, free_port
from tests.support.corpus import long_texts, medium_texts, mixed_texts
from tests.support.procs import Service, count_services, healthy, stop_all, wait_until

if TYPE_CHECKING:  # imported when tracing: it needs opentelemetry-proto
    from bench.otlp_sink import OtlpSink

MODEL = "all-MiniLM-L6-v2"


@contextmanager
def stack(workers: list[list[str]], tokenizer: list[str], pin: list[str | None] | None = None) -> Iterator[str]:
    """A stack with one worker per entry of ``workers`` (extra args each); yields the gateway URL."""
    with fleet(workers, tokenizer, pin) as (base, _):
        yield base


@contextmanager
def fleet(
    workers: list[list[str]],
    tokenizer: list[str],
    pin: list[str | None] | None = None,
    scorer: bool = False,
    watch: Observation | None = None,
) -> Iterator[tuple[str, str]]:
    """As ``stack`` (with a scorer when asked); yields the gateway URL and the NATS URL. ``watch`` (see
    ``observation``): the fleet's metrics scraped and its spans exported."""
    watch = watch or Observation(False)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        server = EmbeddedNats(folder / "nats")
        server.start()
        port = free_port()
        common = ["--nats", server.url]

        def service(role: str, args: list[str]) -> Service:
            return Service(role, [*common, *args, *watch.arguments()], folder, watch.environment)

        services = [service("tokenizer", tokenizer)]
        for i, extra in enumerate(workers):
            services.append(service("worker", ["--max-batch-tokens", "1024", *extra]))
            cpus = pin[i] if pin else None
            if cpus is not None:
                subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(services[-1].proc.pid)], capture_output=True)
        if scorer:
            services.append(service("scorer", []))
        services.append(service("gateway", ["--port", str(port), "--request-timeout", "300"]))
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(
                lambda: healthy(base) and count_services(server.url, "worker") == len(workers),
                180,
                "the stack",
                services,
            )
            if pin:  # threads started after the first pinning inherit it; pin again to be sure
                for cpus, s in zip(pin, services[1 : 1 + len(workers)]):
                    if cpus is not None:
                        subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(s.proc.pid)], capture_output=True)
            watch.scrape_every(1.0)
            assert server.pid is not None  # started above
            watch.pids = [s.proc.pid for s in services] + [server.pid]
            yield base, server.url
        finally:
            watch.stop_scraping()
            stop_all(services)  # side by side; each exports its last spans as it stops
            server.stop()


class Observation:
    """Metrics ports scraped on a thread, spans sent to a receiver in this process; or nothing."""

    def __init__(self, metrics: bool, tracing: bool = False, ratio: float = 1.0) -> None:
        self.metrics, self.tracing, self.ratio = metrics, tracing, ratio
        self.on = metrics or tracing
        self.sink: OtlpSink | None = None  # set when tracing
        self.ports: list[int] = []
        self.scrapes = 0
        self.environment: dict[str, str] = {}
        self.pids: list[int] = []  # the fleet's processes, nats-server included (set by fleet)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if tracing:
            from bench import otlp_sink  # only now: it needs opentelemetry-proto

            self.sink = otlp_sink.OtlpSink().start()

    def arguments(self) -> list[str]:
        args = []
        if self.metrics:
            self.ports.append(free_port())
            args += ["--metrics-port", str(self.ports[-1])]
        if self.sink is not None:  # tracing
            args += ["--otlp-endpoint", self.sink.url, "--trace-sample-ratio", str(self.ratio)]
        return args

    def scrape_every(self, seconds: float) -> None:
        if not self.metrics:
            return

        def scrape() -> None:
            with httpx.Client(timeout=5) as client:
                while not self._stop.wait(seconds):
                    for port in self.ports:
                        try:
                            client.get(f"http://127.0.0.1:{port}/metrics").raise_for_status()
                            self.scrapes += 1
                        except httpx.HTTPError:  # the fleet is stopping
                            pass

        self._thread = threading.Thread(target=scrape, name="scraper", daemon=True)
        self._thread.start()

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the fleet's processes have used so far: what a request costs in
        CPU, whatever else the machine runs meanwhile (throughput moves with the neighbours)."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in self.pids:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        return total / ticks

    @property
    def spans(self) -> int:
        return self.sink.count if self.sink is not None else 0

    def stop_scraping(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        self.stop_scraping()
        if self.sink is not None:
            self.sink.close()


@contextmanager
def observation(metrics: bool, tracing: bool = False, ratio: float = 1.0) -> Iterator[Observation]:
    """``metrics``: every service of a fleet serves its metrics on a port of its own, scraped every
    second as a Prometheus would; ``tracing``: each exports a span per stage of the requests it
    records (``ratio`` of the traces the gateway starts; 1: all, the most tracing can cost) to a local
    OTLP receiver. Neither: as a fleet runs by default."""
    watch = Observation(metrics, tracing, ratio)
    try:
        yield watch
    finally:
        watch.close()


def embed(base: str, texts: list[str]) -> httpx.Response:
    r = httpx.post(f"{base}/v1/embeddings", json={"model": MODEL, "input": texts}, timeout=300)
    r.raise_for_status()
    return r


def bench_tokenizer(args: argparse.Namespace) -> None:
    encoder = TextEncoder(load_model_info(None))
    texts = long_texts(512)
    encoder.encode(texts[:32])
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), 32):  # 32 documents per request, as the long workload sends them
        tokens += sum(len(s) for s in encoder.encode(texts[i : i + 32]))
    rate = tokens / (time.perf_counter() - start)
    print(f"one tokenizer, in-process, long workload: {rate:,.0f} tokens/s ({tokens} tokens)")
    with stack([["--threads", "2"]], []) as base:
        embed(base, texts[:32])
        shares = []
        for i in range(0, 256, 32):
            r = embed(base, texts[i : i + 32])
            shares.append(float(r.headers["x-tokenization-time"]) / max(float(r.headers["x-total-time"]), 1.0))
        print(
            f"end to end (32 long documents per request): tokenizing is {statistics.mean(shares):.1%} of the "
            f"request time (x-tokenization-time / x-total-time, mean over {len(shares)} requests)"
        )


def bench_scaling(args: argparse.Namespace) -> None:
    texts = medium_texts(args.inputs)
    results = {}
    for n in (1, 2):
        with stack([["--threads", "1"]] * n, ["--chunk-seqs", "64"]) as base:
            embed(base, texts[:64])
            start = time.perf_counter()
            r = embed(base, texts)
            results[n] = time.perf_counter() - start
            print(
                f"{n} worker(s): {len(texts)} inputs, {r.json()['usage']['prompt_tokens']} tokens in {results[n]:.2f}s"
            )
    print(f"two workers / one worker: {results[1] / results[2]:.2f}x faster")


def latencies_for(base: str, queries: list[str], seconds: float, concurrency: int) -> list[float]:
    out: list[float] = []
    stop = time.perf_counter() + seconds

    def client(k: int) -> None:
        with httpx.Client(timeout=60) as c:
            i = k
            while time.perf_counter() < stop:
                t = time.perf_counter()
                c.post(
                    f"{base}/v1/embeddings", json={"model": MODEL, "input": queries[i % len(queries)]}
                ).raise_for_status()
                out.append(time.perf_counter() - t)
                i += concurrency

    in_threads(client, concurrency)
    return out


def in_threads(client: Callable[[int], None], concurrency: int) -> None:
    """``client(k)`` for k in 0..concurrency-1, each on a thread of its own, until all return."""
    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def bench_routing(args: argparse.Namespace) -> None:
    queries = [" ".join(t.split()[:14]) for t in mixed_texts(200)]
    hog = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", "while True: pass"])
    try:
        for routing in ("queue", "load", "queue", "load"):
            with stack([["--threads", "1"]] * 2, ["--routing", routing], pin=["0", "1"]) as base:
                latencies_for(base, queries, 1.0, args.concurrency)  # warm-up
                lat = sorted(latencies_for(base, queries, args.seconds, args.concurrency))
                p50, p99 = lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3
                print(
                    f"routing={routing:5}  queries {len(lat):5}  p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  "
                    f"{len(lat) / args.seconds:6.1f} q/s",
                    flush=True,
                )
    finally:
        hog.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("tokenizer")
    scaling = sub.add_parser("scaling")
    scaling.add_argument("--inputs", type=int, default=2000)
    routing = sub.add_parser("routing")
    routing.add_argument("--seconds", type=float, default=8.0)
    routing.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    {"tokenizer": bench_tokenizer, "scaling": bench_scaling, "routing": bench_routing}[args.what](args)


if __name__ == "__main__":
    main()
