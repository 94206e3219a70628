"""The stack bench.sinks measures on, and POST /v1/search's latency through it.

The stack: nats-server, a tokenizer and a worker for the embedding model, a tokenizer and a worker for
the cross-encoder, a scorer, and one gateway per searched store (``--search-sink``: it attaches to
its table on the first search, so the gateways start before the jobs load the tables).

The reranker: no real cross-encoder ships offline, so by default one of ms-marco-MiniLM-L-6-v2's
shape is made: all-MiniLM-L6-v2's encoder (6 layers, hidden 384) under a random one-label head. Its
scores mean nothing; its cost per pair is a real MiniLM cross-encoder's, which is what latency needs.
``--smoke`` uses the tests' tiny random BERT cross-encoder (tests/support/tiny_models.py).
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.fleet import in_threads
from embedfleet.shared.nats.server import EmbeddedNats, free_port
from tests.support.procs import Service, count_services, healthy, stop_all, wait_until

RERANKER = "bench-reranker"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


@dataclass(frozen=True)
class Served:
    """A model folder and the name the fleet serves it under."""

    folder: Path
    name: str


def minilm_cross_encoder(encoder: Path, root: Path) -> Path:
    """``root/minilm-cross-encoder``: ``encoder``'s BERT weights with a random one-label classifier
    (seeded), and its tokenizer: the cost per pair of ms-marco-MiniLM-L-6-v2."""
    import torch
    from transformers import BertForSequenceClassification

    folder = root / "minilm-cross-encoder"
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(str(encoder), num_labels=1)
    model.save_pretrained(folder, safe_serialization=True)
    for name in _TOKENIZER_FILES:
        if (encoder / name).exists():
            shutil.copy(encoder / name, folder / name)
    return folder


def reranker_folder(kind: str, encoder: Path, root: Path) -> tuple[Path, str]:
    """(the cross-encoder's folder, what it is, in words) for ``kind`` "minilm" or "tiny"."""
    if kind == "tiny":
        from tests.support import tiny_models

        return (
            tiny_models.build("bert", root, classifier=True, num_labels=1),
            "the tests' tiny random BERT cross-encoder (2 layers, hidden 64)",
        )
    return (
        minilm_cross_encoder(encoder, root),
        (
            "a cross-encoder of ms-marco-MiniLM-L-6-v2's shape: all-MiniLM-L6-v2's encoder (6 layers, hidden 384), "
            "a random one-label head (scores meaningless, cost real)"
        ),
    )


@contextmanager
def search_fleet(
    embedder: Served, reranker: Served, stores: dict[str, str], folder: Path, threads: int, budget: int | None = None
) -> Iterator[tuple[str, dict[str, str]]]:
    """The stack; yields the NATS URL and, per store name, the base URL of the gateway searching ``stores[name]``.
    ``budget``: each worker's token budget, given (no start-up calibration); by default calibrated."""
    server = EmbeddedNats(folder / "nats")
    server.start()
    common = ["--nats", server.url]
    services: list[Service] = []
    bases: dict[str, str] = {}
    try:
        for model in (embedder, reranker):
            named = ["--model", str(model.folder), "--model-name", model.name]
            services.append(Service("tokenizer", [*common, *named], folder))
            given = ["--max-batch-tokens", str(budget)] if budget else []
            services.append(Service("worker", [*common, *named, "--threads", str(threads), *given], folder))
        services.append(
            Service("scorer", [*common, "--model", str(reranker.folder), "--model-name", reranker.name], folder)
        )
        for store, url in stores.items():
            port = free_port()
            services.append(
                Service(
                    "gateway",
                    [
                        *common,
                        "--port",
                        str(port),
                        "--search-sink",
                        url,
                        "--search-model",
                        embedder.name,
                        "--request-timeout",
                        "300",
                    ],
                    folder,
                )
            )
            bases[store] = f"http://127.0.0.1:{port}"
        wait_until(
            lambda: (
                all(healthy(b) for b in bases.values())
                and count_services(server.url, "worker") == 2
                and count_services(server.url, "scorer") == 1
            ),
            240,
            "the stack",
            services,
        )
        yield server.url, bases
    finally:
        stop_all(services)  # told at once, so they stop side by side
        server.stop()


def search_body(query: str, top_k: int, rerank_top_n: int | None) -> dict:
    body: dict = {"query": query, "top_k": top_k}
    if rerank_top_n is not None:
        body["rerank"] = {"model": RERANKER, "top_n": rerank_top_n}
    return body


def _wrong(r: httpx.Response, body: dict) -> str | None:
    """What is wrong with a search's answer: not 200, or not the hits asked (``top_k`` of them, or
    ``top_n`` reranked ones); None: nothing."""
    if r.status_code != 200:
        return f"HTTP {r.status_code}: {r.text[:300]}"
    answer = r.json()
    rerank = body.get("rerank")
    want = rerank["top_n"] if rerank else body["top_k"]
    if len(answer["data"]) != want or (rerank is not None and answer.get("rerank_model") != rerank["model"]):
        return f"{len(answer['data'])} hits (rerank_model {answer.get('rerank_model')}) for {body}"
    return None


def latencies(base: str, bodies: list[dict], seconds: float, concurrency: int) -> tuple[list[float], float]:
    """Seconds each search took, ``concurrency`` clients each sending the next body as soon as its last
    answered, for ``seconds``; and the seconds until the last one answered. A wrong answer raises."""
    out: list[float] = []
    failures: list[str] = []
    start = time.perf_counter()
    stop = start + seconds

    def client(k: int) -> None:
        with httpx.Client(timeout=300) as c:
            i = k
            while time.perf_counter() < stop and not failures:
                t = time.perf_counter()
                r = c.post(f"{base}/v1/search", json=bodies[i % len(bodies)])
                took = time.perf_counter() - t
                wrong = _wrong(r, bodies[i % len(bodies)])
                if wrong is not None:
                    failures.append(wrong)
                    return
                out.append(took)
                i += concurrency

    in_threads(client, concurrency)
    if failures:
        raise RuntimeError(f"POST {base}/v1/search: {failures[0]}")
    return out, time.perf_counter() - start


def measure(
    base: str, queries: list[str], top_k: int, rerank_top_n: int | None, seconds: float, concurrency: int
) -> dict:
    """p50 / p99 (ms) and searches/s of one store, mode and concurrency, after an unmeasured warm-up."""
    bodies = [search_body(q, top_k, rerank_top_n) for q in queries]
    latencies(base, bodies, min(1.0, seconds), concurrency)
    lat, took = latencies(base, bodies, seconds, concurrency)
    lat.sort()
    return {
        "searches": len(lat),
        "searches_per_s": len(lat) / took,
        "p50_ms": statistics.median(lat) * 1e3,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3,
    }
