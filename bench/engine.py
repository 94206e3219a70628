"""In-process engine throughput against sentence-transformers, on the same texts in one run.

    python -m bench.engine [--model DIR] [--rounds 3] [--budget 2048] [--scale 1.0]
    python -m bench.engine --family qwen3 [--family mpnet ...|--family all] [--shape base|tiny]

``--model`` compares on a model folder (default: the shipped all-MiniLM-L6-v2); ``--family`` builds a
random-weight folder of that family at a real model's sizes (``bench/families.py``) in a temporary
folder and compares on it, one family after the other. For each workload (long: documents truncated
at the model's limit; medium: ~50-token passages) the two run alternately, ``--rounds`` times each;
the median of each is compared. The engine is timed on token batches cut as the worker cuts them
(tokenization is the tokenizer service's job); the reference is timed on its ``encode`` (which
tokenizes too), and the engine's tokenize+forward time is shown beside it. Both count the same
tokens (checked) and give the same vectors (cosine shown). The roofline is the fp32 GEMM peak
measured here at the model's own linear-layer shapes divided by the FLOPs per token (the linear
layers, plus attention over the keys each token actually sees at the workload's lengths).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from bench import families
from bench.workloads import Workload, workloads
from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.engine.attention import AttnMask
from embedfleet.services.gpu_worker.engine.linear import LinearOps, select_linear_ops
from embedfleet.services.gpu_worker.engine.models.base import EncoderModel
from embedfleet.services.tokenizer.encoder import TextEncoder, pack_chunks
from embedfleet.shared.model_dir.info import ModelInfo
from embedfleet.shared.model_dir.load import load_model_info

MAX_ROWS = 256  # rows per engine batch, as the worker packs them


@dataclass(frozen=True)
class Row:
    workload: str
    tokens: int
    reference: float  # tokens/s
    engine: float
    tokenize_engine: float
    flops: float  # per token
    cosine: float  # least cosine of the engine's vectors against the reference's
    peak: float = 0.0  # FLOP/s, set once measured

    @property
    def ratio(self) -> float:
        return self.engine / self.reference

    @property
    def roofline(self) -> float:
        return self.peak / self.flops

    @property
    def share(self) -> float:
        return self.engine / self.roofline


def keys_per_token(lengths: np.ndarray, mask: AttnMask) -> float:
    """Mean number of keys a token sees in sequences of these lengths, under the mask's causality and window."""
    seen, tokens = 0.0, 0
    for length, count in zip(*np.unique(lengths, return_counts=True)):
        i = np.arange(length)
        lo = np.zeros(length) if mask.window is None else np.maximum(i - mask.window, 0)
        hi = (
            i
            if mask.causal
            else (np.full(length, length - 1) if mask.window is None else np.minimum(i + mask.window, length - 1))
        )
        seen += count * float((hi - lo + 1).sum())
        tokens += count * int(length)
    return seen / tokens


def linear_layers(model: EncoderModel) -> list[nn.Linear]:
    """One transformer layer's linear layers (every layer of these families has the same)."""
    return [m for m in model.layers[0].modules() if isinstance(m, nn.Linear)]


def flops_per_token(model: EncoderModel, lengths: np.ndarray) -> tuple[float, float]:
    """(linear, attention) FLOPs per token for one forward over sequences of ``lengths`` tokens.

    Linear: 2 per weight of every layer's linear layers (fused QKV, grouped-query K/V, gated MLPs
    all counted as the model holds them). Attention: q.k^T and p.v, 4 * heads * head_dim per key
    seen, each layer with its own mask (a causal token sees the keys before it, a windowed one those
    in its window) — the FLOPs needed, not those a kernel that ignores the mask spends.
    """
    spec = model.spec
    linear = 2.0 * sum(m.weight.numel() for m in linear_layers(model)) * spec.num_layers
    attention = sum(4.0 * spec.num_heads * spec.head_dim * keys_per_token(lengths, m) for m in model.layer_masks())
    return linear, attention


def gemm_peak(model: EncoderModel, tokens: int, seconds: float = 1.0) -> float:
    """FLOP/s of fp32 GEMMs at one layer's linear shapes, ``tokens`` rows: the faster of PyTorch's
    default matmul and the engine's own linear kernels (so the roofline is not flattered)."""
    layers = [nn.Linear(m.in_features, m.out_features, bias=m.bias is not None) for m in linear_layers(model)]
    inputs = [(torch.randn(tokens, layer.in_features), layer) for layer in layers]
    flops = sum(2 * tokens * layer.in_features * layer.out_features for layer in layers)
    best = 0.0
    with torch.inference_mode():
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


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def compare(info: ModelInfo, label: str, args: argparse.Namespace) -> list[Row]:
    """The engine against sentence-transformers on one model folder: prints its table, returns its rows."""
    from sentence_transformers import SentenceTransformer

    encoder = TextEncoder(info)
    engine = Engine(info, "cpu", "float32", max_batch_tokens=args.budget)
    reference = SentenceTransformer(str(info.path), device="cpu")
    if reference.max_seq_length != info.max_seq_length:
        raise SystemExit(
            f"{label}: sentence-transformers truncates at {reference.max_seq_length} tokens, "
            f"the engine at {info.max_seq_length}: not the same work"
        )
    print(f"model {label}: {engine.describe()}, limit {info.max_seq_length} tokens", flush=True)
    # the better of two measurements, before and after the workloads: the machine is shared
    peak = gemm_peak(engine.model, args.budget, args.peak_seconds)
    rows = [_measure(w, encoder, engine, reference, args) for w in workloads(args.scale).values()]
    peak = max(peak, gemm_peak(engine.model, args.budget, args.peak_seconds))
    rows = [replace(row, peak=peak) for row in rows]
    print(
        f"measured fp32 GEMM peak at the model's shapes: {peak / 1e9:.0f} GFLOP/s (linear kernels: {engine.linear_ops.name})"
    )
    print()
    print(
        f"{'workload':9} {'tokens':>7} {'reference':>10} {'engine':>10} {'tok+engine':>10} {'ratio':>6} "
        f"{'roofline':>9} {'of roofline':>11}  {'model':8} {'cosine':>8}"
    )
    for row in rows:
        print(
            f"{row.workload:9} {row.tokens:>7} {row.reference:>10,.0f} {row.engine:>10,.0f} {row.tokenize_engine:>10,.0f} "
            f"{row.ratio:>5.2f}x {row.roofline:>9,.0f} {row.share:>10.0%}  {label:8} {row.cosine:>8.6f}"
        )
    print(
        "\n(tokens/s; ratio = engine / reference; roofline = GEMM peak / FLOPs per token; "
        "cosine = least of engine vs reference vectors)",
        flush=True,
    )
    return rows


def _measure(w: Workload, encoder: TextEncoder, engine: Engine, reference, args: argparse.Namespace) -> Row:
    ids = encoder.encode(w.texts)
    tokens = sum(len(s) for s in ids)
    # the reference must run the same tokens: its tokenizer, its truncation, no padding counted
    theirs = _reference_tokens(reference, w.texts)
    if theirs != tokens:
        raise SystemExit(
            f"{w.name}: sentence-transformers runs {theirs} tokens, the engine {tokens}: not the same work"
        )
    chunks = list(pack_chunks(ids, args.budget, MAX_ROWS))
    vectors = np.concatenate([engine.embed(c.input_ids, c.cu_seqlens) for c in chunks])  # also the warm-up
    cosine = min_cosine(vectors, reference.encode(w.texts, batch_size=w.per_request, convert_to_numpy=True))
    lengths = np.array([len(s) for s in ids])
    linear, attention = flops_per_token(engine.model, lengths)
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
        for c in pack_chunks(encoder.encode(w.texts), args.budget, MAX_ROWS):
            engine.embed(c.input_ids, c.cu_seqlens)
        full_t.append(time.perf_counter() - t)
    ref, eng, full = (tokens / statistics.median(x) for x in (ref_t, eng_t, full_t))
    return Row(w.name, tokens, ref, eng, full, linear + attention, cosine)


def _reference_tokens(reference, texts: list[str]) -> int:
    """Tokens sentence-transformers feeds its model for ``texts`` (padding not counted)."""
    # sentence-transformers 6 calls it preprocess; earlier releases, tokenize
    features = (reference.preprocess if hasattr(reference, "preprocess") else reference.tokenize)(texts)
    return int(features["attention_mask"].sum())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model folder (default: the shipped all-MiniLM-L6-v2)")
    parser.add_argument(
        "--family",
        action="append",
        choices=[*families.with_reference(), "all"],
        help="build a random-weight folder of this family and compare on it (repeatable; all: every family)",
    )
    parser.add_argument("--shape", default="base", choices=("base", "tiny"), help="sizes of the --family folders")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=int, default=2048, help="engine batch token budget")
    parser.add_argument("--scale", type=float, default=1.0, help="workload size multiplier")
    parser.add_argument(
        "--peak-seconds",
        type=float,
        default=1.0,
        help="seconds of GEMMs per kernel set for the roofline's peak (twice: before and after)",
    )
    args = parser.parse_args(argv)
    if args.model and args.family:
        parser.error("--model and --family exclude each other")

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, CPU")
    if not args.family:
        info = load_model_info(args.model)
        compare(info, info.id, args)
        return
    names = list(families.with_reference()) if "all" in args.family else list(dict.fromkeys(args.family))
    results: dict[str, list[Row]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-families-") as tmp:
        for name in names:
            start = time.perf_counter()
            folder = families.make_folder(name, Path(tmp), args.shape)
            print(
                f"\n== {name} ({args.shape}): {families.describe(name, args.shape)}; "
                f"built in {time.perf_counter() - start:.0f} s",
                flush=True,
            )
            results[name] = compare(load_model_info(str(folder)), name, args)
            shutil.rmtree(folder)  # a base-size folder is up to 2 GB
    print("\nsummary: engine / sentence-transformers (fp32, in-process) and share of the roofline")
    print(
        f"{'family':11} "
        + " ".join(f"{r.workload + ' ratio':>12} {r.workload + ' roof':>11}" for r in results[names[0]])
    )
    for name, rows in results.items():
        print(f"{name:11} " + " ".join(f"{r.ratio:>11.2f}x {r.share:>11.0%}" for r in rows))


if __name__ == "__main__":
    main()
