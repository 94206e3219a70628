"""End-to-end benchmark: the four workloads of the performance notes on real text, through HTTP and
NATS, side by side with the peers, alternating in one run, printing ratios.

    python -m bench.e2e [--rounds 2] [--seconds 10] [--infinity PATH/TO/infinity_emb] [--out DIR]

Systems: embedfleet (nats-server, tokenizer, worker, gateway as processes; POST /v1/embeddings),
the engine in-process, sentence-transformers in-process, and infinity-emb's server when its command
is given (its own virtual environment: ``pip install "infinity-emb[server,torch]"``).
Workloads: long (documents to the model's limit, 32 a request, 4 in flight), medium (~50-token
passages, 8 a request, 8 in flight), single (a 15-20-token query, 1 in flight: p50/p99) and many
singles (32 in flight: queries/s, p99). Tokens are counted with the model's tokenizer, no padding.
Results go to DIR/e2e.json; with matplotlib installed, DIR/throughput.png and DIR/latency.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import orjson

from bench.fleet import fleet, observation
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.nats.server import free_port
from tests.support.corpus import long_texts, medium_texts, mixed_texts

MODEL = "all-MiniLM-L6-v2"
OBSERVED = "embedfleet observed"  # metrics scraped and every request traced (--observability)


@dataclass(frozen=True)
class Workload:
    name: str
    texts: list[str]
    per_request: int
    in_flight: int


QUERY_TOKENS = (15, 20)  # a short query, special tokens included (the performance notes' ~15-20)


def queries(texts: list[str]) -> list[str]:
    """One query per text: its longest run of leading words that has at most QUERY_TOKENS[1] tokens,
    kept when it has at least QUERY_TOKENS[0] (a text's first words can be one long identifier: left out)."""
    from embedfleet.services.tokenizer.encoder import TextEncoder

    low, high = QUERY_TOKENS
    encoder = TextEncoder(load_model_info(None))
    out = []
    for text in texts:
        words = text.split()
        prefixes = [" ".join(words[:n]) for n in range(1, min(len(words), high) + 1)]
        counts = [len(ids) for ids in encoder.encode(prefixes)] if prefixes else []
        fitting = [(c, p) for c, p in zip(counts, prefixes) if c <= high]
        if fitting and fitting[-1][0] >= low:
            out.append(fitting[-1][1])
    return out


def workloads() -> list[Workload]:
    qs = queries(mixed_texts(400))
    return [
        Workload("long", long_texts(512), 32, 4),
        Workload("medium", medium_texts(1024), 8, 8),
        Workload("single", qs, 1, 1),
        Workload("many-singles", qs, 1, 32),
    ]


def token_counts(texts: list[str]) -> dict[str, int]:
    from embedfleet.services.tokenizer.encoder import TextEncoder

    encoder = TextEncoder(load_model_info(None))
    return {t: len(ids) for t, ids in zip(texts, encoder.encode(texts))}


def client_batches(w: Workload, k: int) -> Iterator[list[str]]:
    """The requests' texts client ``k`` of ``w.in_flight`` sends, one list a request, without end: the
    clients take turns through the texts."""
    i = k * w.per_request
    while True:
        yield [w.texts[(i + j) % len(w.texts)] for j in range(w.per_request)]
        i += w.in_flight * w.per_request


async def drive_http(
    url: str, w: Workload, seconds: float, tokens: dict[str, int], model: str = MODEL, errors: Counter | None = None
) -> dict:
    """``in_flight`` clients send requests of ``per_request`` texts for ``seconds``; every request
    started is waited for and counted, and the rate divides by the time until the last answer.
    An error status raises, or with ``errors`` is counted there by status (the request not counted).

    The client is aiohttp (C-accelerated HTTP parsing): it shares the machine's cores with the server
    under test, and a heavier client (httpx: about 2 ms more per single query here) measures itself."""
    import aiohttp

    latencies: list[float] = []
    done_tokens = 0
    start = time.perf_counter()
    stop = start + seconds
    connector = aiohttp.TCPConnector(limit=w.in_flight)
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as client:

        async def one(k: int) -> None:
            nonlocal done_tokens
            for batch in client_batches(w, k):
                if time.perf_counter() >= stop:
                    break
                body = orjson.dumps({"model": model, "input": batch if w.per_request > 1 else batch[0]})
                t = time.perf_counter()
                async with client.post(url, data=body, headers=headers) as r:
                    await r.read()
                    if errors is not None and r.status >= 400:
                        errors[r.status] += 1
                        continue
                    r.raise_for_status()
                latencies.append(time.perf_counter() - t)
                done_tokens += sum(tokens[x] for x in batch)

        await asyncio.gather(*(one(k) for k in range(w.in_flight)))
    took = time.perf_counter() - start
    return load_summary(latencies, done_tokens, took)


def drive_in_process(embed: Callable[[list[str]], object], w: Workload, seconds: float, tokens: dict[str, int]) -> dict:
    latencies: list[float] = []
    done_tokens, i = 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        batch = [w.texts[(i + j) % len(w.texts)] for j in range(w.per_request)]
        i += w.per_request
        t = time.perf_counter()
        embed(batch)
        latencies.append(time.perf_counter() - t)
        done_tokens += sum(tokens[x] for x in batch)
    return load_summary(latencies, done_tokens, time.perf_counter() - start)


def load_summary(latencies: list[float], tokens: int, took: float) -> dict:
    lat = sorted(latencies)
    return {
        "requests": len(lat),
        "tokens": tokens,
        "seconds": took,
        "tokens_per_s": tokens / took,
        "requests_per_s": len(lat) / took,
        "p50_ms": lat[len(lat) // 2] * 1e3 if lat else None,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3 if lat else None,
        "latencies_ms": [round(x * 1e3, 3) for x in lat],
    }


@contextmanager
def infinity_server(
    command: str, dtype: str, seconds: float = 300, folder: Path | None = None, name: str = MODEL
) -> Iterator[str]:
    """infinity-emb's server on ``folder`` (the default model's by default), served as ``name``."""
    port = free_port()
    log = open(Path(tempfile.gettempdir()) / f"infinity-{port}.log", "wb")  # noqa: SIM115 (the server writes it until it stops)
    proc = subprocess.Popen(
        [
            command,
            "v2",
            "--model-id",
            str(folder or load_model_info(None).path),
            "--engine",
            "torch",
            "--device",
            "cpu",
            "--port",
            str(port),
            "--url-prefix",
            "/v1",
            "--served-model-name",
            name,
            "--dtype",
            dtype,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"infinity-emb exited with {proc.returncode}; see {log.name}")
            try:
                if httpx.get(f"{url}/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError("infinity-emb did not start")
        yield f"{url}/v1/embeddings"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def run_http(
    url: str, ws: list[Workload], seconds: float, tokens: dict[str, int], cpu: Callable[[], float] | None = None
) -> dict:
    """Each workload, after a second of warm-up; ``cpu``: the server's CPU seconds so far, read around
    each workload for its CPU milliseconds per request."""
    out = {}
    for w in ws:
        asyncio.run(drive_http(url, w, 1.0, tokens))
        used = cpu() if cpu else 0.0
        out[w.name] = asyncio.run(drive_http(url, w, seconds, tokens))
        if cpu:
            out[w.name]["cpu_ms_per_request"] = (cpu() - used) * 1e3 / max(out[w.name]["requests"], 1)
        print(f"    {w.name:13} {_line(out[w.name])}", flush=True)
    return out


def _line(r: dict) -> str:
    cpu = f"  cpu {r['cpu_ms_per_request']:7.2f} ms/req" if "cpu_ms_per_request" in r else ""
    return (
        f"{r['tokens_per_s']:9,.0f} tok/s {r['requests_per_s']:8.1f} req/s  "
        f"p50 {r['p50_ms']:8.1f} ms  p99 {r['p99_ms']:8.1f} ms{cpu}"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0, help="per workload and system")
    parser.add_argument(
        "--infinity",
        default=os.environ.get("EMBEDFLEET_BENCH_INFINITY"),
        help="infinity_emb command (its own venv); without it infinity-emb is left out",
    )
    parser.add_argument(
        "--budget", type=int, default=2048, help="the worker's and the in-process engine's token budget"
    )
    parser.add_argument("--out", default="bench/results", help="folder for e2e.json and the plots")
    parser.add_argument("--only", nargs="*", default=None, help="workloads to run (default: all four)")
    parser.add_argument(
        "--worker-processes",
        type=int,
        default=1,
        help="embedfleet's workers: processes sharing the cores (threads = cores / processes)",
    )
    parser.add_argument(
        "--systems",
        nargs="*",
        default=None,
        help="systems to run (default: all): engine, sentence-transformers, embedfleet, infinity-emb",
    )
    parser.add_argument(
        "--observability",
        action="store_true",
        help=f"also run '{OBSERVED}': every service's metrics scraped each second and a span per stage "
        "of every request exported over OTLP, alternating with plain embedfleet (the overhead)",
    )
    parser.add_argument(
        "--observability-parts",
        action="store_true",
        help="also run 'embedfleet metrics' (scraped metrics alone) and 'embedfleet tracing' (tracing alone)",
    )
    parser.add_argument(
        "--trace-sample-ratio",
        type=float,
        default=1.0,
        help="the traced systems' --trace-sample-ratio (1: every request recorded)",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="compute dtype of every system (bfloat16 needs a CPU with bf16 instructions to pay off)",
    )
    return parser.parse_args()


def systems_to_run(
    args: argparse.Namespace, ws: list[Workload], tokens: dict[str, int]
) -> dict[str, Callable[[], dict]]:
    """Each system the arguments ask for, by name: a call that runs every workload on it once."""
    import torch
    from sentence_transformers import SentenceTransformer

    from embedfleet.services.gpu_worker.engine import Engine
    from embedfleet.services.tokenizer.encoder import TextEncoder, pack_chunks

    info = load_model_info(None)
    encoder = TextEncoder(info)
    engine = Engine(info, "cpu", args.dtype, max_batch_tokens=args.budget)
    reference = SentenceTransformer(str(info.path), device="cpu").to(getattr(torch, args.dtype))

    def engine_embed(texts: list[str]) -> None:
        for c in pack_chunks(encoder.encode(texts), args.budget, 256):
            engine.embed(c.input_ids, c.cu_seqlens)

    systems: dict[str, Callable[[], dict]] = {
        "engine in-process": lambda: {w.name: drive_in_process(engine_embed, w, args.seconds, tokens) for w in ws},
        "sentence-transformers in-process": lambda: {
            w.name: drive_in_process(partial(reference.encode, batch_size=w.per_request), w, args.seconds, tokens)
            for w in ws
        },
    }

    def embedfleet(metrics: bool = False, tracing: bool = False) -> dict:
        threads = max(1, torch.get_num_threads() // args.worker_processes)
        worker = ["--threads", str(threads), "--max-batch-tokens", str(args.budget), "--dtype", args.dtype]
        with observation(metrics, tracing, args.trace_sample_ratio) as watch:
            with fleet([worker] * args.worker_processes, [], watch=watch) as (base, _):
                results = run_http(f"{base}/v1/embeddings", ws, args.seconds, tokens, watch.cpu_seconds)
            if watch.on:  # proof that it was on: what the receiver and the scraper got
                results["observed"] = {"spans": watch.spans, "scrapes": watch.scrapes}
                print(f"    observed: {watch.spans} spans received, {watch.scrapes} scrapes", flush=True)
        return results

    systems["embedfleet"] = embedfleet
    if args.observability:
        systems[OBSERVED] = lambda: embedfleet(metrics=True, tracing=True)
    if args.observability_parts:
        systems["embedfleet metrics"] = lambda: embedfleet(metrics=True)
        systems["embedfleet tracing"] = lambda: embedfleet(tracing=True)
    if args.infinity:

        def infinity() -> dict:
            with infinity_server(args.infinity, args.dtype) as url:
                return run_http(url, ws, args.seconds, tokens)

        systems["infinity-emb"] = infinity

    if args.systems is not None:
        systems = {name: run for name, run in systems.items() if name.split()[0] in args.systems}
    return systems


def run_rounds(systems: dict[str, Callable[[], dict]], count: int) -> list[dict]:
    rounds: list[dict] = []
    for r in range(count):
        results = {}
        # every other round in the reverse order: no system always runs first (a cold cache) or last
        for name, run in list(systems.items())[::-1] if r % 2 else systems.items():
            print(f"round {r + 1}: {name}", flush=True)
            results[name] = run()
            if "in-process" in name:
                for w, res in results[name].items():
                    print(f"    {w:13} {_line(res)}", flush=True)
        rounds.append(results)
    return rounds


def write_results(out: Path, summary: dict, rounds: list[dict], dtype: str) -> None:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    machine = {
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "dtype": dtype,
    }
    (out / "e2e.json").write_text(json.dumps({"machine": machine, "summary": summary, "rounds": rounds}, indent=1))
    print(f"\nwrote {out / 'e2e.json'}")
    try:
        from bench.plots import plot

        for path in plot(summary, rounds, out, machine):
            print(f"wrote {path}")
    except ImportError:
        print("(no plots: pip install matplotlib)")


def main() -> None:
    args = parse_args()
    ws = [w for w in workloads() if args.only is None or w.name in args.only]
    tokens: dict[str, int] = {}
    for w in ws:
        tokens |= token_counts(w.texts)
    rounds = run_rounds(systems_to_run(args, ws, tokens), args.rounds)
    summary = summarize(rounds, [w.name for w in ws])
    report(summary)
    observability_overhead(summary)
    write_results(Path(args.out), summary, rounds, args.dtype)


def observability_overhead(s: dict) -> None:
    """embedfleet with metrics scraped and every request traced, against embedfleet without, per workload."""
    plain = s.get("embedfleet", {})
    others = [name for name in (OBSERVED, "embedfleet metrics", "embedfleet tracing") if name in s]
    if not plain or not others:
        return
    print("\nobservability on / off (same run; target: under 2% of throughput)")
    for name in others:
        for w, b in s[name].items():
            a = plain[w]
            print(
                f"  {name:20} {w:13} tokens/s {b['tokens_per_s'] / a['tokens_per_s']:.3f}x  CPU per request "
                f"{b['cpu_ms_per_request'] / a['cpu_ms_per_request']:.3f}x ({a['cpu_ms_per_request']:.2f} -> "
                f"{b['cpu_ms_per_request']:.2f} ms)  p50 {a['p50_ms']:.1f} -> {b['p50_ms']:.1f} ms  "
                f"p99 {a['p99_ms']:.1f} -> {b['p99_ms']:.1f} ms"
            )


def summarize(rounds: list[dict], names: list[str]) -> dict:
    """Medians over rounds of each system's figures per workload."""
    out: dict = {}
    for system in rounds[0]:
        out[system] = {}
        for w in names:
            vals = [r[system][w] for r in rounds if w in r[system]]
            keys = ("tokens_per_s", "requests_per_s", "p50_ms", "p99_ms", "cpu_ms_per_request")
            out[system][w] = {k: statistics.median(v[k] for v in vals) for k in keys if all(k in v for v in vals)}
    return out


def report(s: dict) -> None:
    print("\nmedians over rounds")
    for system, by in s.items():
        for w, r in by.items():
            print(f"  {system:34} {w:13} {_line(r)}")
    ef = s.get("embedfleet", {})
    eng, inf = s.get("engine in-process", {}), s.get("infinity-emb")
    print("\nratios (targets from the performance notes)")
    if "long" in ef and "long" in eng:
        print(
            f"  long: embedfleet / engine in-process = {ef['long']['tokens_per_s'] / eng['long']['tokens_per_s']:.0%} (>= 90%)"
        )
    for w in ("long", "medium"):
        if inf and w in ef:
            print(f"  {w}: embedfleet / infinity-emb = {ef[w]['tokens_per_s'] / inf[w]['tokens_per_s']:.2f}x (>= 2x)")
    if "single" in ef:
        print(
            f"  single: p50 {ef['single']['p50_ms']:.1f} ms (<= 5), p99 {ef['single']['p99_ms']:.1f} ms (<= 15)"
            + (f"; infinity-emb p50 {inf['single']['p50_ms']:.1f} ms" if inf else "")
        )
    if "many-singles" in ef:
        m = ef["many-singles"]
        line = f"  many singles: {m['requests_per_s']:.0f} q/s, p99 {m['p99_ms']:.0f} ms (< 100)"
        if inf:
            line += f"; {m['requests_per_s'] / inf['many-singles']['requests_per_s']:.2f}x infinity-emb's q/s (>= 3x)"
        print(line)


if __name__ == "__main__":
    main()
