"""Memory of ``embedfleet up``'s processes: each one's RSS and PSS after every model has served
some requests. PSS splits the pages processes share (Python, torch's libraries) among them, so the
stack's PSS sum is what it really holds; its RSS sum counts shared pages once per process. CPU
figures: on a GPU each worker process also holds its CUDA context.

    python -m bench.stack_memory                                 # the shipped all-MiniLM-L6-v2 alone
    python -m bench.stack_memory --minilm-stack                  # + MiniLM under a second id + a MiniLM-sized cross-encoder
    python -m bench.stack_memory --model DIR --model ID=DIR ...  # any models, as `up` takes them
    python -m bench.stack_memory --engines-in-one-process 3      # instead: 1, 2, 3 MiniLM engines in this process
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from embedfleet.shared.model_dir.folder import default_model_path
from embedfleet.shared.nats.server import free_port
from tests.support.corpus import medium_texts, mixed_texts


def minilm_cross_encoder(folder: Path) -> Path:
    """A cross-encoder of all-MiniLM-L6-v2's shape (BertForSequenceClassification, one label,
    random weights): the memory of a real MiniLM reranker without a download."""
    from transformers import BertConfig, BertForSequenceClassification

    source = default_model_path()
    config = BertConfig.from_pretrained(source, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").iterdir():
            children = [int(c) for c in (task / "children").read_text().split()]
            found += children
            todo += children
    return found


def memory_mib(pid: int) -> tuple[float, float]:
    """(RSS, PSS) in MiB."""
    rss = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    pss = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        if line.startswith("Pss:")
    )
    return rss / 1024, pss / 1024


def label(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    if "embedfleet.services.cli" not in argv:
        return Path(argv[0]).name
    role = argv[argv.index("embedfleet.services.cli") + 1]
    return f"{role}[{argv[argv.index('--model-name') + 1]}]" if "--model-name" in argv else role


def exercise(base: str) -> None:
    """Requests to every model, so that each process holds what serving takes (buffers, kernels)."""
    models = httpx.get(f"{base}/v1/models", timeout=30).json()["data"]
    texts, docs = mixed_texts(64), medium_texts(32)
    for model in models:
        for _ in range(3):
            if model["kind"] == "rerank":
                r = httpx.post(
                    f"{base}/v1/rerank",
                    json={"model": model["id"], "query": "how to read a file", "documents": docs},
                    timeout=300,
                )
            else:
                r = httpx.post(f"{base}/v1/embeddings", json={"model": model["id"], "input": texts}, timeout=300)
            r.raise_for_status()


def engines_in_one_process(count: int) -> None:
    """This process's RSS holding 1..count all-MiniLM-L6-v2 engines (each its own weights), each run
    on the same batches: what a model costs where several engines share one worker process."""
    from embedfleet.services.gpu_worker.engine import Engine
    from embedfleet.services.gpu_worker.engine.calibrate import synthetic_batch
    from embedfleet.shared.model_dir.load import load_model_info

    print(f"python and torch: {memory_mib(os.getpid())[0]:.0f} MiB RSS")
    engines = []
    for i in range(count):
        engine = Engine(
            load_model_info(None, f"minilm-{i}"),
            "cpu",
            None,
            graphs=False,
            attention="auto",
            max_batch_tokens=2048,
            max_batch_seqs=256,
        )
        for tokens in (512, 2048):
            engine.embed(*synthetic_batch(engine, tokens, 128))
        engines.append(engine)
        print(f"{i + 1} engine(s): {memory_mib(os.getpid())[0]:.0f} MiB RSS")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", default=[], help="[ID=]DIR, as `embedfleet up --model`")
    parser.add_argument(
        "--minilm-stack",
        action="store_true",
        help="serve all-MiniLM-L6-v2, the same folder as 'minilm-2', and a MiniLM-sized cross-encoder",
    )
    parser.add_argument(
        "--engines-in-one-process", type=int, metavar="N", help="measure N engines in this process instead"
    )
    args = parser.parse_args()
    if args.engines_in_one_process:
        engines_in_one_process(args.engines_in_one_process)
        return
    scratch = Path(tempfile.mkdtemp(prefix="embedfleet-memory-"))
    models = list(args.model)
    if args.minilm_stack:
        minilm = default_model_path()
        reranker = minilm_cross_encoder(scratch / "ce")
        models += [f"all-MiniLM-L6-v2={minilm}", f"minilm-2={minilm}", f"minilm-reranker={reranker}"]
    port = free_port()
    log = scratch / "up.log"
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "EMBEDFLEET_NATS_URL")}
    command = [
        sys.executable,
        "-m",
        "embedfleet.services.cli",
        "up",
        "--port",
        str(port),
        "--data-dir",
        str(scratch / "data"),
        *(x for m in models for x in ("--model", m)),
    ]
    up = subprocess.Popen(command, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env)  # noqa: SIM115 (the child holds it)
    try:
        deadline = time.monotonic() + 600
        while "embedfleet is up" not in log.read_text():
            if up.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"the stack did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        exercise(f"http://127.0.0.1:{port}")
        rows = sorted((label(pid), *memory_mib(pid)) for pid in descendants(up.pid))
        rows.append(("embedfleet up", *memory_mib(up.pid)))
        print(f"{'process':<40} {'RSS MiB':>8} {'PSS MiB':>8}")
        for name, rss, pss in rows:
            print(f"{name:<40} {rss:8.0f} {pss:8.0f}")
        total = f"total ({len(rows)} processes)"
        print(f"{total:<40} {sum(r[1] for r in rows):8.0f} {sum(r[2] for r in rows):8.0f}")
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(120)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
