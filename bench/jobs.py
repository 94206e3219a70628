"""Bulk-job benchmarks on real processes (nats-server, tokenizer, worker, gateway), ratios in one run.

python -m bench.jobs throughput   # long workload: tokens/s through the job path (embedfleet
                                  # reindex -> JetStream -> tokenizer -> worker -> results)
                                  # against the engine in-process, alternating rounds
python -m bench.jobs latency      # single-query p50/p99 through HTTP, idle and while a job runs
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.fleet import embed, fleet, latencies_for
from bench.workloads import workloads
from embedfleet.shared.model_dir.load import load_model_info
from tests.support.corpus import medium_texts, mixed_texts


def docs_file(folder: Path, name: str, texts: list[str]) -> Path:
    path = folder / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"id": f"{name}-{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return path


def _reindex(nats_url: str, docs: Path, out: Path, job: str, batch: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "embedfleet.services.cli",
            "reindex",
            str(docs),
            "--out",
            str(out),
            "--nats",
            nats_url,
            "--job-id",
            job,
            "--batch-size",
            str(batch),
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def bench_throughput(args: argparse.Namespace) -> None:
    import torch

    from embedfleet.services.gpu_worker.engine import Engine
    from embedfleet.services.tokenizer.encoder import TextEncoder, pack_chunks

    texts = workloads(args.scale)["long"].texts
    info = load_model_info(None)
    encoder = TextEncoder(info)
    torch.set_num_threads(args.threads)
    engine = Engine(info, "cpu", max_batch_tokens=args.budget)
    ids = encoder.encode(texts)
    tokens = sum(len(s) for s in ids)
    chunks = list(pack_chunks(ids, args.budget, 256))
    worker = ["--threads", str(args.threads), "--max-batch-tokens", str(args.budget)]
    with (
        tempfile.TemporaryDirectory() as tmp,
        fleet([worker], ["--chunk-tokens", str(args.budget)]) as (base, nats_url),
    ):
        folder = Path(tmp)
        docs = docs_file(folder, "long", texts)
        embed(base, texts[:8])  # warm the stack
        for c in chunks[:2]:
            engine.embed(c.input_ids, c.cu_seqlens)
        in_process, with_tokenizer, job_path = [], [], []
        for r in range(args.rounds):
            t = time.perf_counter()
            for c in chunks:
                engine.embed(c.input_ids, c.cu_seqlens)
            in_process.append(tokens / (time.perf_counter() - t))
            t = time.perf_counter()  # the same, tokenizing too (the job path tokenizes on the same cores)
            for i in range(0, len(texts), args.batch):
                for c in pack_chunks(encoder.encode(texts[i : i + args.batch]), args.budget, 256):
                    engine.embed(c.input_ids, c.cu_seqlens)
            with_tokenizer.append(tokens / (time.perf_counter() - t))
            proc = _reindex(nats_url, docs, folder / f"out{r}.npy", f"bench-{time.time_ns()}", args.batch)
            output = proc.communicate(timeout=900)[0]
            if proc.returncode != 0:
                raise SystemExit(output)
            rate = re.search(r"\(([\d,]+) tokens/s\)", output)
            if rate is None:
                raise SystemExit(f"no tokens/s in the job's output:\n{output}")
            job_path.append(float(rate.group(1).replace(",", "")))
            print(
                f"round {r + 1}: engine in-process {in_process[-1]:,.0f}  tokenizer+engine in-process "
                f"{with_tokenizer[-1]:,.0f}  job path {job_path[-1]:,.0f} tokens/s",
                flush=True,
            )
    a, t, b = (statistics.median(x) for x in (in_process, with_tokenizer, job_path))
    print(
        f"\nlong workload, {len(texts)} documents, {tokens} tokens, {args.threads} engine threads, budget {args.budget} "
        f"(medians of {args.rounds} rounds):"
    )
    print(
        f"job path {b:,.0f} tokens/s = {b / a:.0%} of the engine in-process ({a:,.0f}), "
        f"{b / t:.0%} of tokenizer+engine in-process ({t:,.0f})"
    )


def bench_latency(args: argparse.Namespace) -> None:
    queries = [" ".join(t.split()[:14]) for t in mixed_texts(200)]
    worker = ["--threads", str(args.threads), "--max-batch-tokens", str(args.budget)]
    if args.bulk_budget:
        worker += ["--bulk-batch-tokens", str(args.bulk_budget)]
    with tempfile.TemporaryDirectory() as tmp, fleet([worker], []) as (base, nats_url):
        docs = docs_file(Path(tmp), "job", medium_texts(args.job_docs))
        latencies_for(base, queries, 1.0, 1)  # warm-up
        rows = []
        for phase in ("idle", "job running", "idle", "job running"):
            proc = None
            if phase == "job running":
                proc = _reindex(nats_url, docs, Path(tmp) / "out.npy", f"lat-{time.time_ns()}", 64)
                time.sleep(3.0)  # the job is flowing
            lat = sorted(latencies_for(base, queries, args.seconds, 1))
            if proc is not None:
                if proc.poll() is not None:
                    print("(the job ended during the measurement: raise --job-docs)")
                proc.communicate(timeout=900)  # the job runs to its end before the next idle phase
            p50, p90, p99 = (lat[int(len(lat) * q)] * 1e3 for q in (0.5, 0.9, 0.99))
            rows.append((phase, p50, p99))
            print(
                f"{phase:12} queries {len(lat):5}  p50 {p50:7.1f} ms  p90 {p90:7.1f} ms  p99 {p99:7.1f} ms", flush=True
            )
    idle = [r for r in rows if r[0] == "idle"]
    busy = [r for r in rows if r[0] != "idle"]
    print(
        f"\nsingle queries, one at a time, bulk batches of {args.bulk_budget or args.budget} tokens: p99 idle {statistics.mean(r[2] for r in idle):.1f} ms, "
        f"with a job running {statistics.mean(r[2] for r in busy):.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("throughput", "latency"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=float, default=2.0, help="long workload size multiplier")
    parser.add_argument("--threads", type=int, default=2, help="engine threads (in-process and the worker)")
    parser.add_argument("--budget", type=int, default=2048, help="engine batch token budget")
    parser.add_argument("--bulk-budget", type=int, default=None, help="latency: the worker's --bulk-batch-tokens")
    parser.add_argument("--batch", type=int, default=64, help="documents per job batch")
    parser.add_argument("--seconds", type=float, default=15.0, help="latency: seconds per phase")
    parser.add_argument("--job-docs", type=int, default=3000, help="latency: documents in the background job")
    args = parser.parse_args()
    {"throughput": bench_throughput, "latency": bench_latency}[args.what](args)


if __name__ == "__main__":
    main()
