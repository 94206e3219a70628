"""What writing into a vector store costs against a Parquet file, and what searching one costs, in one run.

    python -m bench.sinks [--documents 1500] [--seconds 5] [--model-dir DIR] [--out-dir bench/results/sinks]
    python -m bench.sinks --smoke      # every sink and search mode once, at tiny sizes (the test)

One stack (bench/sink_search.py: nats-server, tokenizer, worker, scorer, gateways as processes) serving
all-MiniLM-L6-v2 (or ``--model-dir``). ``--documents`` passages of about 50 tokens (real text, with two
metadata fields each).

Jobs: the same re-index job, ``embedfleet reindex INPUT`` with ``--out X.parquet`` and with ``--sink``
into pgvector (PostgreSQL from pgserver), LanceDB on disk and Qdrant's local mode (a folder: no Qdrant
server installs here), each with ``--with-text`` (the sinks keep each document's text, for search and
rerank). Job rows/s: documents over the command's wall time, index build included.

Store only: the embedding dominates a job's time, so each sink's own cost is also timed apart, on the
Parquet job's rows: ``open`` + ``write`` in batches of shared/jobs/sink_writer.py's BATCH_ROWS +
``finish`` (pgvector: the HNSW index; LanceDB: compaction; Qdrant's local mode: nothing), against
pyarrow writing the same columns (id, vector, metadata, text) to Parquet in the same batches. A job
upserts sooner than BATCH_ROWS, every BATCH_SECONDS, so the same is timed again in batches of the rows
the Parquet job collected in BATCH_SECONDS ("small batches"): where a store's cost is per upsert.

Search: POST /v1/search over HTTP against gateways started with ``--search-sink`` on the pgvector
table and the LanceDB table the jobs made, a fixed set of short queries, ``--top-k`` candidates,
without and with rerank (the cross-encoder reranks all ``--top-k`` candidates, keeps ``--top-n``), at
each ``--concurrency``: p50, p99, searches/s. Results go to OUT_DIR/sinks.json.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import sink_search
from bench.sink_search import RERANKER, Served
from embedfleet.shared.jobs.sink_writer import BATCH_ROWS, BATCH_SECONDS
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.sinks import Rows, Shape, sink_for
from tests.support.corpus import medium_texts, mixed_texts

MODEL = "all-MiniLM-L6-v2"
SINKS = ("parquet", "pgvector", "lancedb", "qdrant")
SEARCHED = ("pgvector", "lancedb")
FINISH = {"parquet": "none", "pgvector": "HNSW index", "lancedb": "compaction", "qdrant": "none (local mode)"}


def documents(n: int) -> tuple[list[str], list[dict]]:
    """``n`` passages of about 50 tokens, and each one's metadata."""
    texts = medium_texts(n)
    return texts, [{"n": i, "even": i % 2 == 0} for i in range(n)]


def queries() -> list[str]:
    """A fixed set of short queries (the first 14 words of real texts)."""
    return list(dict.fromkeys(" ".join(t.split()[:14]) for t in mixed_texts(200)))


def write_documents(path: Path, texts: list[str], metadata: list[dict]) -> None:
    path.write_text(
        "".join(json.dumps({"id": f"d{i}", "text": t, **m}) + "\n" for i, (t, m) in enumerate(zip(texts, metadata)))
    )


def store_urls(folder: Path, pg_uri: str, name: str) -> dict[str, str]:
    """Each sink's URL for a fresh table ``name`` (the folders under ``folder``)."""
    return {
        "pgvector": f"{pg_uri}&table={name}",
        "lancedb": f"lancedb://{folder}/lance?table={name}",
        "qdrant": f"qdrant://{folder}/qdrant-{name}?collection={name}",
    }


def run_job(nats_url: str, docs: Path, model: str, sink: str, target: str, job: str) -> dict:
    """One ``embedfleet reindex`` into ``target`` (a .parquet path, or a sink URL); its wall time."""
    where = ["--out", target] if sink == "parquet" else ["--sink", target, "--with-text"]
    command = [
        sys.executable,
        "-m",
        "embedfleet.services.cli",
        "reindex",
        str(docs),
        "--nats",
        nats_url,
        "--model",
        model,
        "--job-id",
        job,
        "--quiet",
        *where,
    ]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(
            f"reindex into {sink} failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    rows = re.search(r"\((\d+) rows\)", done.stdout)
    return {"seconds": seconds, "rows": int(rows.group(1)) if rows else None, "said": done.stdout.strip()[-400:]}


def job_rows(parquet: Path, texts: list[str], metadata: list[dict]) -> Rows:
    """The Parquet job's rows (its ids and vectors), with each document's metadata and text."""
    import pyarrow.parquet as pq

    table = pq.read_table(parquet)
    ids = table.column("id").to_pylist()
    vectors = np.asarray(table.column("vector").to_pylist(), np.float32)  # [n, dim]
    index = [int(i[1:]) for i in ids]
    return Rows(ids, vectors, [metadata[i] for i in index], texts=[texts[i] for i in index])


def _dense(rows: Rows) -> tuple[np.ndarray, list[dict[str, Any] | None], list[str | None]]:
    """The vectors [n, dim], metadata and texts of rows as ``job_rows`` makes them (all three kept)."""
    if not isinstance(rows.vectors, np.ndarray) or rows.metadata is None or rows.texts is None:
        raise TypeError("dense rows with their metadata and texts expected")
    return rows.vectors, rows.metadata, rows.texts


def _batches(rows: Rows, size: int) -> list[Rows]:
    vectors, metadata, texts = _dense(rows)
    return [
        Rows(rows.ids[s : s + size], vectors[s : s + size], metadata[s : s + size], texts=texts[s : s + size])
        for s in range(0, len(rows.ids), size)
    ]


def store_parquet(rows: Rows, path: Path, size: int) -> dict:
    """pyarrow writing the rows' columns to ``path``, a row group a batch of ``size`` rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    width = _dense(rows)[0].shape[1]
    start = time.perf_counter()
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("vector", pa.list_(pa.float32(), width)),
            ("metadata", pa.string()),
            ("text", pa.string()),
        ]
    )
    with pq.ParquetWriter(path, schema) as writer:
        for b in _batches(rows, size):
            flat, metadata, texts = _dense(b)
            vectors = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), width)
            writer.write_table(
                pa.table(
                    [pa.array(b.ids), vectors, pa.array([json.dumps(m) for m in metadata]), pa.array(texts)],
                    schema=schema,
                )
            )
    return {"seconds": time.perf_counter() - start, "finish_seconds": 0.0}


def store_sink(rows: Rows, url: str, size: int) -> dict:
    """A sink's ``open`` + ``write`` of each batch of ``size`` rows + ``finish``, timed (``finish`` apart too)."""
    sink = sink_for(url)
    width = _dense(rows)[0].shape[1]
    try:
        start = time.perf_counter()
        sink.open(Shape("float32", "dense", width))
        for b in _batches(rows, size):
            sink.write(b)
        written = time.perf_counter()
        sink.finish()
        end = time.perf_counter()
        if sink.count() != len(rows.ids):
            raise RuntimeError(f"{sink.shown} holds {sink.count()} rows, not {len(rows.ids)}")
    finally:
        sink.close()
    return {"seconds": end - start, "finish_seconds": end - written}


def _warm_clients() -> None:
    """The stores' clients imported before any timing (an import is not a write)."""
    import importlib

    for module in ("lancedb", "psycopg", "pgvector.psycopg", "pyarrow.parquet", "qdrant_client"):
        importlib.import_module(module)


def run(args: argparse.Namespace) -> dict:
    import pgserver

    texts, metadata = documents(args.documents)
    model_dir = Path(args.model_dir) if args.model_dir else load_model_info(None).path
    model = MODEL if args.model_dir is None else model_dir.name
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        docs = folder / "docs.jsonl"
        write_documents(docs, texts, metadata)
        reranker, reranker_said = sink_search.reranker_folder(args.reranker, model_dir, folder)
        pg = pgserver.get_server(folder / "pg", cleanup_mode="stop")
        try:
            jobs = store_urls(folder, pg.get_uri(), "job")
            searched = {s: jobs[s] for s in SEARCHED}
            with sink_search.search_fleet(
                Served(model_dir, model),
                Served(reranker, RERANKER),
                searched,
                folder,
                args.threads,
                # the smoke run skips the workers' start-up calibration (seconds of CPU that measure nothing here)
                budget=2048 if args.smoke else None,
            ) as (nats_url, bases):
                job = {}
                for sink in SINKS:
                    target = str(folder / "job.parquet") if sink == "parquet" else jobs[sink]
                    job[sink] = run_job(nats_url, docs, model, sink, target, f"bench-{sink}-{time.time_ns()}")
                    print(
                        f"  job into {sink:<8} {args.documents / job[sink]['seconds']:8.1f} rows/s "
                        f"({job[sink]['seconds']:.1f} s)",
                        flush=True,
                    )
                rows = job_rows(folder / "job.parquet", texts, metadata)
                _warm_clients()
                # a job's upserts: BATCH_ROWS rows, or what it collected in BATCH_SECONDS (at the Parquet job's rate)
                small = max(1, round(args.documents / job["parquet"]["seconds"] * BATCH_SECONDS))
                store: dict[str, dict] = {}
                trickle: dict[str, dict] = {}
                for found, name, size in ((store, "store", BATCH_ROWS), (trickle, "small", small)):
                    found["parquet"] = store_parquet(rows, folder / f"{name}.parquet", size)
                    for sink, url in store_urls(folder, pg.get_uri(), name).items():
                        found[sink] = store_sink(rows, url, size)
                search = {}
                for name, base in bases.items():
                    for mode, top_n in (("plain", None), ("rerank", args.top_n)):
                        for c in args.concurrency:
                            result = sink_search.measure(base, queries(), args.top_k, top_n, args.seconds, c)
                            search[f"{name} {mode} c{c}"] = {"store": name, "mode": mode, "concurrency": c, **result}
                            print(
                                f"  search {name:<8} {mode:<6} c{c:<2} p50 {result['p50_ms']:7.1f} ms  "
                                f"p99 {result['p99_ms']:7.1f} ms",
                                flush=True,
                            )
        finally:
            pg.cleanup()
    return {
        "documents": args.documents,
        "model": model,
        "batch_rows": BATCH_ROWS,
        "small_batch_rows": small,
        "reranker": reranker_said,
        "top_k": args.top_k,
        "top_n": args.top_n,
        "queries": len(queries()),
        "seconds": args.seconds,
        "finish": FINISH,
        "table": table(job, store, trickle, args.documents),
        "jobs": job,
        "store_only": store,
        "store_only_small_batches": trickle,
        "search": search,
        "qdrant": "local mode (a folder, qdrant-client in-process): no Qdrant server installs here",
    }


def table(job: dict, store: dict, trickle: dict, documents: int) -> list[dict]:
    """A row per sink: job and store-only rows/s, each against Parquet's, the finish (index) seconds, and
    store-only rows/s in the job's small batches."""
    out = []
    for sink in SINKS:
        job_rate, store_rate = documents / job[sink]["seconds"], documents / store[sink]["seconds"]
        out.append(
            {
                "sink": sink,
                "job_rows_per_s": job_rate,
                "job_vs_parquet": job_rate / (documents / job["parquet"]["seconds"]),
                "store_rows_per_s": store_rate,
                "store_vs_parquet": store_rate / (documents / store["parquet"]["seconds"]),
                "index_build_s": store[sink]["finish_seconds"],
                "store_small_rows_per_s": documents / trickle[sink]["seconds"],
            }
        )
    return out


def report(data: dict) -> None:
    print(
        f"\n{data['documents']} documents of ~50 tokens, {data['model']}; store-only writes in batches of "
        f"{data['batch_rows']} rows (small: {data['small_batch_rows']} rows, what the job collects in "
        f"{BATCH_SECONDS:g} s); Qdrant: {data['qdrant']}"
    )
    print(
        f"{'sink':<9} {'job rows/s':>10} {'job/parquet':>11} {'store rows/s':>12} {'store/parquet':>13} "
        f"{'index build s':>13} {'small batches rows/s':>20}  finish"
    )
    for r in data["table"]:
        print(
            f"{r['sink']:<9} {r['job_rows_per_s']:10.1f} {r['job_vs_parquet']:10.2f}x {r['store_rows_per_s']:12.0f} "
            f"{r['store_vs_parquet']:12.3f}x {r['index_build_s']:13.3f} {r['store_small_rows_per_s']:20.0f}  "
            f"{data['finish'][r['sink']]}"
        )
    print(
        f"\nPOST /v1/search, {data['queries']} fixed queries, top_k {data['top_k']}; rerank: all {data['top_k']} "
        f"candidates reranked (top_n {data['top_n']}) by {data['reranker']}"
    )
    print(f"{'store':<9} {'mode':<7} {'clients':>7} {'p50 ms':>8} {'p99 ms':>8} {'searches/s':>10}")
    for s in data["search"].values():
        print(
            f"{s['store']:<9} {s['mode']:<7} {s['concurrency']:7d} {s['p50_ms']:8.1f} {s['p99_ms']:8.1f} "
            f"{s['searches_per_s']:10.1f}"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--documents", type=int, default=1500, help="documents of the re-index job")
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per store, mode and concurrency")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8], help="clients searching at once")
    p.add_argument("--top-k", type=int, default=20, help="candidates a search fetches (and rerank scores)")
    p.add_argument("--top-n", type=int, default=10, help="results rerank keeps")
    p.add_argument("--threads", type=int, default=2, help="each worker's CPU threads")
    p.add_argument("--model-dir", default=None, help="the embedding model's folder (default: all-MiniLM-L6-v2)")
    p.add_argument(
        "--reranker",
        choices=("minilm", "tiny"),
        default="minilm",
        help="minilm: a cross-encoder of ms-marco-MiniLM-L-6-v2's shape; tiny: the tests' tiny one",
    )
    p.add_argument("--out-dir", default="bench/results/sinks", help="folder for sinks.json")
    p.add_argument(
        "--smoke", action="store_true", help="40 documents, 0.5 s a search cell at 2 clients, the tiny reranker"
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.documents, args.seconds, args.concurrency, args.reranker = 40, 0.5, [2], "tiny"
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    data = run(args)
    save(data, Path(args.out_dir) / "sinks.json")
    report(data)


def save(data: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
