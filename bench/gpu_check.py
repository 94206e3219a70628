"""Everything that needs a GPU, in one run of a few minutes, written as JSON.

    python3 -m bench.gpu_check --out gpu_check.json      # on a CUDA machine (bench/gpu_check.sh)
    python3 -m bench.gpu_check --smoke --out smoke.json  # the same code paths, tiny, on CPU

Models are built on the spot with random weights (``bench/families.py``, only the files the engine
reads), so nothing has to be carried to the machine: one model per family at a real model's sizes —
all-MiniLM-L6-v2 (head size 32: no FlashInfer) and BERT-base, all-mpnet-base-v2, ModernBERT-base,
Qwen3-Embedding-0.6B and EmbeddingGemma-300m (in the engine's default dtype, float32 since it
overflows float16, and in bfloat16). For each it records:
- the attention backend and dtype the engine chooses, and whether CUDA graphs are possible with them;
- correctness: CUDA eager and CUDA graphs against the CPU fp32 engine (cosine of the pooled vectors,
  on three mixed batches of up to 2,048 tokens, rows up to the 512-token limit), graphs against eager;
- throughput: tokens/s at 50 and 512 tokens per sequence, graphs off and on (where possible);
and for BERT-base also 1/2/4 replicas and the saturation curve (tokens/s by token budget).
A model that fails is recorded with its error and the run goes on; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bench import families, page_models, two_towers
from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.engine.calibrate import calibrate, synthetic_batch
from embedfleet.shared.model_dir.info import ModelInfo
from embedfleet.shared.model_dir.load import load_model_info

# (rows, longest row): at most 2,048 tokens each, so every batch fits the graphed engine's largest bucket
CORRECTNESS_BATCHES = ((24, 64), (4, 512), (8, 256))


@dataclass(frozen=True)
class Check:
    name: str
    family: str
    shape: str  # bench.families shape on CUDA; every check is "tiny" with --smoke
    dtype: str | None = None  # None: the engine's choice for the device
    replicas: tuple[int, ...] = (1,)
    saturation: bool = False
    images: bool = False  # a two-tower model (bench/two_towers.py): its image tower checked too
    pages: bool = False  # a page model (bench/page_models.py): queries and pages, a vector per token


CHECKS = (
    Check("minilm", "bert", "minilm"),
    Check("bert-base", "bert", "base", replicas=(1, 2, 4), saturation=True),
    Check("mpnet", "mpnet", "base"),
    Check("modernbert", "modernbert", "base"),
    Check("gte", "gte", "base"),
    Check("nomic", "nomic_bert", "base"),
    Check("nomic-moe", "nomic_moe", "base"),
    Check("eurobert", "eurobert", "base"),
    Check("jina-v3", "jina_v3", "base"),  # its five task adapters, rows of every task in each batch
    Check("jina-v5", "jina_v5", "base"),  # its four PEFT task adapters, likewise
    Check("qwen3", "qwen3", "base"),
    Check("gemma3", "gemma3", "base"),
    Check("gemma3-bf16", "gemma3", "base", dtype="bfloat16"),
    Check("gemma2", "gemma2", "base"),
    Check("clip", "clip", "base", images=True),  # ViT-B/32: texts (77 positions) and 224-pixel images
    Check("siglip", "siglip", "base", images=True),  # base/16: texts padded to 64, images through its pooling head
    Check("siglip2", "siglip2", "base", images=True),  # NaFlex: each image at its own grid of up to 256 patches
    # ColQwen2 at Qwen2-VL-2B's widths (4 language layers, 8 vision blocks): pages of up to 768 image tokens
    Check("colqwen2", "colqwen2", "mid", pages=True),
    Check("colqwen2-bf16", "colqwen2", "mid", dtype="bfloat16", pages=True),
)
# page grids (gh, gw patches) checked against the CPU, and the grid of the pages/s batches; --smoke: tiny's
PAGE_GRIDS = {"mid": ((28, 20), (12, 36), (4, 4)), "tiny": ((8, 8), (4, 12), (2, 2))}
PAGE_RATE_GRID = {"mid": (32, 24), "tiny": (8, 8)}
# image batches checked against the CPU: counts that hit several graph buckets (and one past none)
IMAGE_BATCHES = (1, 5, 16)


def mixed_batch(seed: int, rows: int, max_len: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, max_len + 1, size=rows)
    cu = np.zeros(rows + 1, np.int32)
    np.cumsum(lengths, out=cu[1:])
    return rng.integers(1000, vocab, size=int(cu[-1])).astype(np.int32), cu


def cosine_min(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def row_adapters(engine: Engine, cu: np.ndarray) -> np.ndarray | None:
    """A model with task adapters: row r runs adapter r % (n + 1) (0: none), every task in each batch."""
    n = len(engine.adapter_names)
    return np.arange(len(cu) - 1) % (n + 1) if n else None


def run(engine: Engine, ids: np.ndarray, cu: np.ndarray) -> np.ndarray:
    made = engine.step(ids, cu, adapters=row_adapters(engine, cu)).result()
    assert isinstance(made, np.ndarray)
    return made


def correctness(info: ModelInfo, eager: Engine, graphed: Engine | None) -> dict:
    """The device engine (eager, and graphed where possible) against the CPU fp32 engine (a model with
    task adapters: its rows spread over every task)."""
    reference = Engine(info, "cpu", "float32", graphs=False)
    batches, eager_cosine = 0, 1.0
    graphs_cosine: float | None = None  # stays None without a graphed engine
    graphs_diff: float | None = None
    wants = []
    for seed, (rows, max_len) in enumerate(CORRECTNESS_BATCHES):
        ids, cu = mixed_batch(seed, rows, min(max_len, eager.max_seq_length), eager.spec.vocab_size)
        wants.append((ids, cu, run(reference, ids, cu)))
    del reference
    for ids, cu, want in wants * 2:  # two passes over the batch shapes: graphs captured, then replayed
        got = run(eager, ids, cu)
        eager_cosine = min(eager_cosine, cosine_min(got, want))
        if graphed is not None:
            g = run(graphed, ids, cu)
            graphs_cosine = min(graphs_cosine or 1.0, cosine_min(g, want))
            diff = float(np.abs(g - got).max())
            graphs_diff = max(graphs_diff or 0.0, diff)
        batches += 1
    out: dict[str, float | int | None] = {
        "batches": batches,
        "min_cosine_eager_vs_cpu": eager_cosine,
        "min_cosine_graphs_vs_cpu": graphs_cosine,
        "max_abs_graphs_vs_eager": graphs_diff,
    }
    graphs = graphed.graphs if graphed is not None else None
    if graphs is not None:
        out["graph_captures"], out["graph_replays"] = graphs.captures, graphs.replays
    return out


def throughput(engines: list[Engine], seq_len: int, budget: int, seconds: float) -> dict:
    """All replicas stepping concurrently, each with one batch in flight behind the one running."""
    ids, cu = synthetic_batch(engines[0], (budget // seq_len) * seq_len, seq_len)
    adapters = row_adapters(engines[0], cu)
    for e in engines:
        run(e, ids, cu)  # warm-up and capture
    counts = [0] * len(engines)
    stop = time.perf_counter() + seconds

    def loop(i: int, engine: Engine) -> None:
        pending: deque = deque()
        while time.perf_counter() < stop:
            pending.append(engine.step(ids, cu, adapters=adapters))
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


def image_check(info: ModelInfo, eager: Engine, device: str, dtype: str | None, smoke: bool, seconds: float) -> dict:
    """A two-tower model's image tower: eager and graphed (bucketed by image count) against the CPU fp32
    engine on random pixels, and images/s at a full batch, graphs off and on."""
    path = eager.image_path
    assert path is not None  # an images check is of a model with an image tower
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 256, (n, *path.shape), dtype=np.uint8) for n in IMAGE_BATCHES]
    reference = Engine(info, "cpu", "float32", graphs=False)
    wants = [reference.embed_images(pixels) for pixels in batches]
    del reference
    graphed = None
    if device == "cuda" and eager.attention.capturable:
        graphed = Engine(info, device, dtype, graphs=True, max_batch_tokens=2048, max_batch_seqs=64, model=eager.model)
    out: dict = {"batches": list(IMAGE_BATCHES), "runs": []}
    eager_cos, graphs_cos = 1.0, None
    for pixels, want in list(zip(batches, wants)) * 2:  # captured, then replayed
        eager_cos = min(eager_cos, cosine_min(eager.embed_images(pixels), want))
        if graphed is not None:
            handle = graphed.step_images(pixels)
            graphs_cos = min(graphs_cos or 1.0, cosine_min(np.asarray(handle.result()), want))
            out["runs"].append(handle.run)
    out |= {"min_cosine_eager_vs_cpu": eager_cos, "min_cosine_graphs_vs_cpu": graphs_cos}
    full = max(1, min(64, 2048 // max(1, info.image_tokens)))
    pixels = rng.integers(0, 256, (full, *path.shape), dtype=np.uint8)
    rates = []
    for engine in [e for e in (eager, graphed) if e is not None]:
        engine.step_images(pixels).result()  # warm-up (and capture)
        count, stop = 0, time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < stop:
            engine.step_images(pixels).result()
            count += full
        rates.append(
            {"graphs": engine is graphed, "batch": full, "images_per_s": count / (time.perf_counter() - start)}
        )
    out["throughput"] = rates
    print(
        f"  images: min cosine vs CPU fp32 eager {eager_cos:.5f}, graphs {graphs_cos}; "
        + ", ".join(f"{'graphs' if r['graphs'] else 'eager'} {r['images_per_s']:,.0f} images/s" for r in rates),
        flush=True,
    )
    return out


def patch_image_check(info: ModelInfo, eager: Engine, seconds: float) -> dict:
    """A NaFlex model's image tower (SigLIP 2: every batch eager): images of several grids in one batch
    against the CPU fp32 engine on random patch rows, and images/s at a batch of the budget's images."""
    path = eager.patch_path
    assert path is not None  # a NaFlex model
    most, width = path.processing.max_patches, path.processing.row_bytes
    side = max(1, int(most**0.5))
    shapes = [(side, side), (1, most), (max(1, side // 2), max(1, most // max(1, side // 2))), (2, 3), (1, 1)]
    rng = np.random.default_rng(0)

    def batch(grids: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        rows = rng.integers(0, 256, (sum(h * w for h, w in grids), width), dtype=np.uint8)
        return rows, np.array(grids, np.int32)

    batches = [batch(shapes[:1]), batch(shapes)]
    reference = Engine(info, "cpu", "float32", graphs=False)
    wants = [np.asarray(reference.step_patches(b).result()) for b in batches]
    del reference
    least = min(cosine_min(np.asarray(eager.step_patches(b).result()), want) for b, want in zip(batches, wants))
    full = batch([(side, side)] * max(1, min(64, 2048 // most)))
    eager.step_patches(full).result()  # warm-up
    count, start = 0, time.perf_counter()
    while time.perf_counter() < start + seconds:
        eager.step_patches(full).result()
        count += len(full[1])
    rate = count / (time.perf_counter() - start)
    print(f"  images (own grids): min cosine vs CPU fp32 {least:.5f}; eager {rate:,.0f} images/s", flush=True)
    return {
        "grids": [list(s) for s in shapes],
        "min_cosine_eager_vs_cpu": least,
        "throughput": [{"graphs": False, "batch": len(full[1]), "images_per_s": rate}],
    }


def page_rows(rng: np.random.Generator, engine: Engine, grids: list[tuple[int, int]], queries: int) -> tuple:
    """A batch of ``queries`` text rows, then a page row per grid (prompt tokens around its image tokens, random
    patch rows): (ids, cu, (patches, grids) or None)."""
    proc = engine.page_processing
    assert proc is not None  # a page model
    vocab, token = page_models.BPE_VOCAB, engine.info.image_token_id
    rows = [rng.integers(2, vocab, int(rng.integers(8, 40))) for _ in range(queries)]
    rows += [
        np.concatenate(
            [rng.integers(2, vocab, 12), np.full(gh * gw // proc.merge_size**2, token), rng.integers(2, vocab, 6)]
        )
        for gh, gw in grids
    ]
    cu = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int32)
    ids = np.concatenate(rows).astype(np.int32)
    if not grids:
        return ids, cu, None
    patches = rng.integers(0, 256, (sum(gh * gw for gh, gw in grids), proc.row_bytes), dtype=np.uint8)
    return ids, cu, (patches, np.array(grids, np.int32))


def page_check(info: ModelInfo, eager: Engine, smoke: bool, seconds: float) -> dict:
    """A page model: queries, pages and both in one batch, a vector per token, against the CPU fp32 engine;
    pages/s and query tokens/s (every batch of a page model runs eagerly: it makes no dense vectors)."""
    shape = "tiny" if smoke else "mid"
    rng = np.random.default_rng(0)
    batches = [page_rows(rng, eager, [], 8), page_rows(rng, eager, list(PAGE_GRIDS[shape][:2]), 0)]
    batches.append(page_rows(rng, eager, list(PAGE_GRIDS[shape][2:]), 3))

    def tokens(engine: Engine, ids: np.ndarray, cu: np.ndarray, pages) -> np.ndarray:
        made = engine.step(ids, cu, outputs=("multivector",), pages=pages).result()
        assert isinstance(made, dict)
        return made["multivector"]

    reference = Engine(info, "cpu", "float32", graphs=False)
    wants = [tokens(reference, *batch) for batch in batches]
    del reference
    cos = min(cosine_min(tokens(eager, *batch), want) for batch, want in zip(batches, wants))
    out: dict = {"min_cosine_eager_vs_cpu": cos, "grids": [list(g) for g in PAGE_GRIDS[shape]]}
    for name, batch in (
        ("pages", page_rows(rng, eager, [PAGE_RATE_GRID[shape]] * 8, 0)),
        ("queries", page_rows(rng, eager, [], 64)),
    ):
        tokens(eager, *batch)  # warm-up
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            tokens(eager, *batch)
            count += 1
        elapsed = time.perf_counter() - start
        rows, n = len(batch[1]) - 1, int(batch[1][-1])
        out[name] = {
            "rows": rows,
            "tokens": n,
            "rows_per_s": count * rows / elapsed,
            "tokens_per_s": count * n / elapsed,
        }
    print(
        f"  pages: min cosine vs CPU fp32 {cos:.5f}; {out['pages']['rows_per_s']:,.1f} pages/s "
        f"({PAGE_RATE_GRID[shape]} patches each), queries {out['queries']['tokens_per_s']:,.0f} tokens/s",
        flush=True,
    )
    return out


def check_model(check: Check, folder: Path, device: str, smoke: bool, seconds: float) -> dict:
    """One model's record: backend and dtype, correctness, throughput (and saturation where asked)."""
    start = time.perf_counter()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    info = load_model_info(str(folder))
    eager = Engine(info, device, check.dtype, graphs=False, max_batch_tokens=2048, max_batch_seqs=64)
    graphs_possible = device == "cuda" and eager.attention.capturable
    record: dict = {
        "family": check.family,
        "shape": "tiny" if smoke else check.shape,
        "sizes": _describe(check, "tiny" if smoke else check.shape),
        "engine": eager.describe(),
        "attention": eager.attention.name,
        "dtype": eager.dtype_name,
        "graphs_possible": graphs_possible,
        "adapters": list(eager.adapter_names),  # rows spread over these tasks (and none) in every batch
    }
    if check.pages:  # its own check: a vector per token of queries and pages (no dense path to time)
        record["pages"] = page_check(info, eager, smoke, seconds)
        return _finish(record, device, start)
    graphed = None
    if graphs_possible:
        graphed = Engine(
            info, device, check.dtype, graphs=True, max_batch_tokens=2048, max_batch_seqs=64, model=eager.model
        )
    record["correctness"] = correctness(info, eager, graphed)
    print(
        f"{check.name}: {record['engine']}; min cosine vs CPU fp32: eager {record['correctness']['min_cosine_eager_vs_cpu']:.5f}, "
        f"graphs {record['correctness']['min_cosine_graphs_vs_cpu']}",
        flush=True,
    )
    del graphed

    budget = 1024 if smoke else 8192
    runs = []
    for graphs in [False, True] if graphs_possible else [False]:
        first = Engine(
            info, device, check.dtype, graphs=graphs, max_batch_tokens=budget, max_batch_seqs=256, model=eager.model
        )
        for seq_len in (50, 512):
            for replicas in check.replicas:
                engines = [first] + [first.replicate() for _ in range(replicas - 1)]
                # rows at most the model's limit (CLIP's 77, SigLIP's 64): "seq_len" says the point asked
                point = throughput(engines, min(seq_len, first.max_seq_length), budget, seconds)
                runs.append({"seq_len": seq_len, "graphs": graphs, "replicas": replicas, **point})
                print(
                    f"  seq {seq_len:4} graphs {graphs!s:5} replicas {replicas}: {point['tokens_per_s']:,.0f} tokens/s",
                    flush=True,
                )
        del first, engines
    record["throughput"] = runs

    if check.images:
        record["images"] = (
            patch_image_check(info, eager, seconds)
            if eager.patch_path is not None
            else image_check(info, eager, device, check.dtype, smoke, seconds)
        )
    if check.saturation:
        engine = Engine(
            info,
            device,
            check.dtype,
            graphs=graphs_possible,
            max_batch_tokens=budget * 2,
            max_batch_seqs=512,
            model=eager.model,
        )
        budgets = (64, 128, 256) if smoke else (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
        curve = calibrate(engine, budgets=budgets, min_seconds=0.05 if smoke else 0.5)
        record["saturation"] = {"points": curve.points, "knee": curve.knee}
        print(f"  saturation: {curve.describe()}", flush=True)
    return _finish(record, device, start)


def _finish(record: dict, device: str, start: float) -> dict:
    if device == "cuda":
        record["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    record["seconds"] = time.perf_counter() - start
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU: checks the script itself")
    parser.add_argument("--seconds", type=float, default=2.0, help="per throughput point")
    parser.add_argument(
        "--only", action="append", choices=[c.name for c in CHECKS], help="run only these models (repeatable)"
    )
    args = parser.parse_args()
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device (use --smoke to run the script's code paths on CPU)")
    import transformers

    results: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "smoke": args.smoke,
        "models": {},
    }
    try:
        import flashinfer

        results["flashinfer"] = getattr(flashinfer, "__version__", "installed")
    except ImportError:
        results["flashinfer"] = None
    checks = [c for c in CHECKS if not args.only or c.name in args.only]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        folders: dict[tuple[str, str], Path] = {}
        for i, check in enumerate(checks):
            shape = "tiny" if args.smoke else check.shape
            key = (check.family, shape)
            try:
                if key not in folders:
                    folders[key] = (
                        two_towers.make_two_tower(
                            check.family, Path(tmp) / f"{check.family}-{shape}", shape, tokenizer=False
                        )
                        if check.images
                        else page_models.make_colqwen2(Path(tmp) / f"colqwen2-{shape}", shape, tokenizer=False)
                        if check.pages
                        else families.make_folder(check.family, Path(tmp), shape, reference=False)
                    )
                record = check_model(check, folders[key], device, args.smoke, 0.1 if args.smoke else args.seconds)
            except Exception as exc:  # one model's failure must not cost the others' figures
                traceback.print_exc()
                record = {"family": check.family, "shape": shape, "error": f"{type(exc).__name__}: {exc}"}
            results["models"][check.name] = record
            if key in folders and all((c.family, "tiny" if args.smoke else c.shape) != key for c in checks[i + 1 :]):
                shutil.rmtree(folders.pop(key))  # a base-size folder is up to 2 GB
            if device == "cuda":
                torch.cuda.empty_cache()
            results["wall_seconds"] = time.perf_counter() - t0
            _write(args.out, results)
    _summary(results)
    if any("error" in r for r in results["models"].values()):
        raise SystemExit(1)


def _describe(check: Check, shape: str) -> str:
    if check.pages:
        text, vision, _ = page_models.SHAPES[shape]
        return (
            f"language hidden {text['hidden_size']} x {text['num_hidden_layers']} layers; vision "
            f"{vision['embed_dim']} x {vision['depth']} blocks; random weights"
        )
    if not check.images:
        return families.describe(check.family, shape)
    text, vision = two_towers.text_config(check.family, shape), two_towers.vision_config(check.family, shape)
    pixels = (
        f"at their own grids of up to {two_towers.MAX_NUM_PATCHES[shape]}"
        if check.family == "siglip2"
        else f"{two_towers.image_size(check.family, shape)} px in"
    )
    return (
        f"text hidden {text['hidden_size']} x {text['num_hidden_layers']} layers; images "
        f"{pixels} {vision['patch_size']}-px patches, hidden "
        f"{vision['hidden_size']} x {vision['num_hidden_layers']} layers; random weights"
    )


def _summary(results: dict) -> None:
    print(
        f"\n{'model':12} {'attention':18} {'dtype':9} {'cos eager':>9} {'cos graphs':>10} "
        f"{'50 eager':>12} {'50 graphs':>12} {'512 eager':>12} {'512 graphs':>12}"
    )
    for name, r in results["models"].items():
        if "error" in r:
            print(f"{name:12} error: {r['error']}")
            continue
        if "pages" in r:
            p = r["pages"]
            print(
                f"{name:12} {r['attention']:18} {r['dtype']:9} {p['min_cosine_eager_vs_cpu']:>9.5f} {'-':>10} "
                f"pages {p['pages']['rows_per_s']:,.1f}/s, queries {p['queries']['tokens_per_s']:,.0f} tokens/s"
            )
            continue
        rate = {(p["seq_len"], p["graphs"]): p["tokens_per_s"] for p in r["throughput"] if p["replicas"] == 1}
        c = r["correctness"]
        graphs_cos = "-" if c["min_cosine_graphs_vs_cpu"] is None else f"{c['min_cosine_graphs_vs_cpu']:.5f}"
        cells = " ".join(
            f"{rate[(s, g)]:>12,.0f}" if (s, g) in rate else f"{'-':>12}" for s in (50, 512) for g in (False, True)
        )
        print(
            f"{name:12} {r['attention']:18} {r['dtype']:9} {c['min_cosine_eager_vs_cpu']:>9.5f} {graphs_cos:>10} {cells}"
        )
    print(f"(tokens/s, one replica; wall {results['wall_seconds']:.0f} s)")


def _write(path: str, results: dict) -> None:
    Path(path).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
