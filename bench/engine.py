"""In-process engine throughput against sentence-transformers, on the same texts in one run.

    python -m bench.engine [--rounds 3] [--budget 2048] [--scale 1.0]

For each workload (long: documents at the model's limit; medium: ~50-token passages) the two run
alternately, ``--rounds`` times each; the median of each is compared. The engine is timed on token
batches cut as the worker cuts them (tokenization is the tokenizer service's job); the reference
is timed on its ``encode`` (which tokenizes too), and the engine's tokenize+forward time is shown
beside it. The roofline is the fp32 GEMM peak measured here at the model's matrix shapes divided
by the FLOPs per token (linear layers, plus attention at the workload's mean length).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from shared.model_dir import load_model_info
from services.gpu_worker.engine import Engine
from services.gpu_worker.engine.linear import LinearOps, select_linear_ops
from services.gpu_worker.engine.spec import ModelSpec
from services.tokenizer.encoder import TextEncoder, pack_chunks
from bench.workloads import workloads


def flops_per_token(spec: ModelSpec, mean_len: float) -> tuple[float, float]:
    """(linear, attention) FLOPs per token for one forward."""
    h, i, layers = spec.hidden_size, spec.intermediate_size, spec.num_layers
    linear = 2 * (4 * h * h + 2 * h * i) * layers  # qkv + out projection, up + down
    attention = 4 * mean_len * h * layers  # q.k^T and p.v
    return float(linear), float(attention)


def gemm_peak(spec: ModelSpec, tokens: int, seconds: float = 1.0) -> float:
    """FLOP/s of fp32 GEMMs at the encoder's shapes, weighted as in one layer: the faster of
    PyTorch's default matmul and the engine's own linear kernels (so the roofline is not flattered)."""
    h, i = spec.hidden_size, spec.intermediate_size
    shapes = [(tokens, h, 3 * h), (tokens, h, h), (tokens, h, i), (tokens, i, h)]
    flops = sum(2 * m * k * n for m, k, n in shapes)
    inputs = [(torch.randn(m, k), torch.nn.Linear(k, n)) for m, k, n in shapes]
    best = 0.0
    for ops in {LinearOps(), select_linear_ops(torch.device("cpu"), torch.float32)}:
        for x, layer in inputs:
            ops.linear(x, layer)
        runs, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for x, layer in inputs:
                ops.linear(x, layer)
            runs += 1
        best = max(best, runs * flops / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=int, default=2048, help="engine batch token budget")
    parser.add_argument("--scale", type=float, default=1.0, help="workload size multiplier")
    args = parser.parse_args()

    from sentence_transformers import SentenceTransformer

    info = load_model_info(None)
    encoder = TextEncoder(info)
    engine = Engine(info, "cpu", max_batch_tokens=args.budget)
    reference = SentenceTransformer(str(info.path), device="cpu")
    peak = gemm_peak(engine.spec, args.budget)
    print(f"model {info.id}, torch {torch.__version__}, {torch.get_num_threads()} threads, fp32")
    print(f"measured fp32 GEMM peak at the model's shapes: {peak / 1e9:.0f} GFLOP/s (linear kernels: {engine.linear_ops.name})")
    print()
    header = f"{'workload':9} {'tokens':>7} {'reference':>10} {'engine':>10} {'tok+engine':>10} {'ratio':>6} {'roofline':>9} {'of roofline':>11}"
    print(header)
    for w in workloads(args.scale).values():
        ids = encoder.encode(w.texts)
        tokens = sum(len(s) for s in ids)
        chunks = list(pack_chunks(ids, args.budget, 256))
        linear, attention = flops_per_token(engine.spec, tokens / len(ids))
        roofline = peak / (linear + attention)
        ref_t, eng_t, full_t = [], [], []
        for _ in range(args.rounds):
            t = time.perf_counter()
            reference.encode(w.texts, batch_size=w.per_request)
            ref_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            for c in chunks:
                engine.embed(c.input_ids, c.cu_seqlens)
            eng_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            for c in pack_chunks(encoder.encode(w.texts), args.budget, 256):
                engine.embed(c.input_ids, c.cu_seqlens)
            full_t.append(time.perf_counter() - t)
        ref, eng, full = (tokens / statistics.median(x) for x in (ref_t, eng_t, full_t))
        print(
            f"{w.name:9} {tokens:>7} {ref:>10,.0f} {eng:>10,.0f} {full:>10,.0f} {eng / ref:>5.2f}x "
            f"{roofline:>9,.0f} {eng / roofline:>10.0%}"
        )
    print("\n(tokens/s; ratio = engine / reference; roofline = GEMM peak / FLOPs per token)")


if __name__ == "__main__":
    np.random.seed(0)
    main()
