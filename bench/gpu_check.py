"""Everything that needs a GPU, in one run of a few minutes, written as JSON.

    python3 -m bench.gpu_check --out gpu_check.json      # on a CUDA machine
    python3 -m bench.gpu_check --smoke --out smoke.json  # the same code paths, tiny, on CPU

Models are built on the spot with random weights (transformers' BertModel), so nothing has to be
carried to the machine: a MiniLM-shaped model (head size 32: no FlashInfer) and a BERT-base-shaped
one (head size 64). It records:
- correctness: CUDA eager and CUDA graphs against the CPU fp32 engine (cosine), graphs against eager;
- throughput: tokens/s at 50 and 512 tokens per sequence, graphs on/off, 1/2/4 replicas;
- saturation: tokens/s by token budget (the start-up calibration's curve).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch

from shared.model_dir import load_model_info
from services.gpu_worker.engine import Engine
from services.gpu_worker.engine.calibrate import calibrate, synthetic_batch

SHAPES = {
    # name: (hidden, layers, heads, intermediate)
    "minilm": (384, 6, 12, 1536),
    "bert-base": (768, 12, 12, 3072),
    "tiny": (64, 2, 2, 128),
}


def make_model(folder: Path, shape: str, max_seq: int) -> Path:
    from transformers import BertConfig, BertModel

    hidden, layers, heads, inter = SHAPES[shape]
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=inter, max_position_embeddings=max_seq,
    )
    BertModel(config, add_pooling_layer=False).save_pretrained(folder / shape, safe_serialization=True)
    (folder / shape / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq}))
    return folder / shape


def mixed_batch(seed: int, rows: int, max_len: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, max_len + 1, size=rows)
    cu = np.zeros(rows + 1, np.int32)
    np.cumsum(lengths, out=cu[1:])
    return rng.integers(1000, vocab, size=int(cu[-1])).astype(np.int32), cu


def cosine_min(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def correctness(path: Path, device: str, graphs: bool) -> dict:
    info = load_model_info(str(path))
    reference = Engine(info, "cpu", "float32", graphs=False)
    eager = Engine(info, device, graphs=False, max_batch_tokens=2048, max_batch_seqs=64)
    graphed = (
        Engine(info, device, graphs=True, max_batch_tokens=2048, max_batch_seqs=64, model=eager.model) if graphs else None
    )
    out = {"attention": eager.attention.name, "dtype": eager.dtype_name, "batches": 0,
           "min_cosine_eager_vs_cpu": 1.0, "min_cosine_graphs_vs_cpu": None, "max_abs_graphs_vs_eager": None}
    for seed in range(6):  # two passes over three batch shapes: captures, then replays
        ids, cu = mixed_batch(seed % 3, rows=24, max_len=min(info.max_seq_length, 128), vocab=30522)
        want = reference.embed(ids, cu)
        got = eager.embed(ids, cu)
        out["min_cosine_eager_vs_cpu"] = min(out["min_cosine_eager_vs_cpu"], cosine_min(got, want))
        if graphed is not None:
            g = graphed.embed(ids, cu)
            out["min_cosine_graphs_vs_cpu"] = min(out["min_cosine_graphs_vs_cpu"] or 1.0, cosine_min(g, want))
            diff = float(np.abs(g - got).max())
            out["max_abs_graphs_vs_eager"] = max(out["max_abs_graphs_vs_eager"] or 0.0, diff)
        out["batches"] += 1
    if graphed is not None:
        out["graph_captures"], out["graph_replays"] = graphed.graphs.captures, graphed.graphs.replays
    return out


def throughput(engines: list[Engine], seq_len: int, budget: int, seconds: float) -> dict:
    """All replicas stepping concurrently, each with one batch in flight behind the one running."""
    ids, cu = synthetic_batch(engines[0], (budget // seq_len) * seq_len, seq_len)
    for e in engines:
        e.embed(ids, cu)  # warm-up and capture
    counts = [0] * len(engines)
    stop = time.perf_counter() + seconds

    def loop(i: int, engine: Engine) -> None:
        pending: deque = deque()
        while time.perf_counter() < stop:
            pending.append(engine.step(ids, cu))
            if len(pending) > 1:
                pending.popleft().wait()
                counts[i] += len(ids)
        while pending:
            pending.popleft().wait()
            counts[i] += len(ids)

    start = time.perf_counter()
    threads = [threading.Thread(target=loop, args=(i, e)) for i, e in enumerate(engines)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return {"tokens_per_s": sum(counts) / elapsed, "tokens": sum(counts), "seconds": elapsed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU: checks the script itself")
    parser.add_argument("--seconds", type=float, default=3.0, help="per throughput point")
    args = parser.parse_args()
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device (use --smoke to run the script's code paths on CPU)")
    graphs_possible = device == "cuda"
    seconds = 0.3 if args.smoke else args.seconds
    results: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "smoke": args.smoke,
    }
    try:
        import flashinfer

        results["flashinfer"] = getattr(flashinfer, "__version__", "installed")
    except ImportError:
        results["flashinfer"] = None
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        shapes = ["tiny"] if args.smoke else ["minilm", "bert-base"]
        folders = {s: make_model(Path(tmp), s, 512) for s in shapes}
        results["correctness"] = {s: correctness(p, device, graphs_possible) for s, p in folders.items()}
        _write(args.out, results)

        big = folders[shapes[-1]]
        info = load_model_info(str(big))
        budget = 1024 if args.smoke else 8192
        runs = []
        for seq_len in (50, 512):
            for graphs in ([False, True] if graphs_possible else [False]):
                first = Engine(info, device, graphs=graphs, max_batch_tokens=budget, max_batch_seqs=256)
                for replicas in (1, 2, 4):
                    engines = [first] + [first.replicate() for _ in range(replicas - 1)]
                    point = throughput(engines, seq_len, budget, seconds)
                    runs.append({"seq_len": seq_len, "graphs": graphs, "replicas": replicas,
                                 "attention": first.attention.name, **point})
                    print(f"seq {seq_len:4} graphs {graphs!s:5} replicas {replicas}: {point['tokens_per_s']:,.0f} tokens/s", flush=True)
                    _write(args.out, {**results, "throughput": runs})
        results["throughput"] = runs

        engine = Engine(info, device, graphs=graphs_possible, max_batch_tokens=budget * 2, max_batch_seqs=512)
        budgets = (64, 128, 256) if args.smoke else (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
        curve = calibrate(engine, budgets=budgets, min_seconds=0.05 if args.smoke else 0.5)
        results["saturation"] = {"points": curve.points, "knee": curve.knee}
    results["wall_seconds"] = time.perf_counter() - t0
    _write(args.out, results)
    print(json.dumps({k: v for k, v in results.items() if k != "throughput"}, indent=1))


def _write(path: str, results: dict) -> None:
    Path(path).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
