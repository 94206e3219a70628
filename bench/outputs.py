"""Sparse and multi-vector outputs: the engine against sentence-transformers, on the same texts in one run.

    python -m bench.outputs [--rounds 3] [--scale 1.0]

Builds two folders on the shipped all-MiniLM-L6-v2 encoder (6 layers, hidden 384, BERT's 30522-token
vocabulary) in a temporary folder: a SPLADE SparseEncoder (a random masked-LM head, max pooling) and a
ColBERT-style MultiVectorEncoder (a random Dense 384 -> 128 per token, punctuation skiplist, Normalize). For each, on the medium
workload (~50-token passages), the engine (token batches cut as the worker cuts them; its
tokenization timed beside) and the reference's ``encode`` run alternately, ``--rounds`` times each;
the medians are compared. The outputs are checked equal (sparse: same nonzero set, least cosine;
multi-vector: least cosine over all token vectors). Also printed: the bytes one input's output takes
on the wire, per form.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.workloads import workloads
from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.ragged import sparse_rows, token_rows
from embedfleet.services.tokenizer.encoder import TextEncoder, pack_chunks
from embedfleet.shared.model_dir.load import load_model_info

MAX_ROWS = 256
BUDGET = 2048


def _folders(root: Path) -> dict[str, Path]:
    """SPLADE and ColBERT-style folders on all-MiniLM-L6-v2's encoder (its real weights; the heads random)."""
    import string

    from sentence_transformers import MultiVectorEncoder, SparseEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling
    from transformers import BertForMaskedLM

    base = load_model_info(None).path
    mlm = root / "minilm-mlm"
    model = BertForMaskedLM.from_pretrained(str(base))  # the encoder's weights; a random masked-LM head
    model.save_pretrained(mlm, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (base / name).is_file():
            (mlm / name).write_bytes((base / name).read_bytes())
    SparseEncoder(modules=[MLMTransformer(str(mlm)), SpladePooling("max")], device="cpu").save(str(root / "splade"))
    dense = Dense(
        384,
        128,
        bias=False,
        activation_function=torch.nn.Identity(),
        module_input_name="token_embeddings",
        module_output_name="token_embeddings",
    )
    modules = [
        Transformer(str(base)),
        dense,
        MultiVectorMask(skiplist_words=list(string.punctuation)),
        Normalize(module_input_name="token_embeddings", module_output_name="token_embeddings"),
    ]
    MultiVectorEncoder(modules=modules, device="cpu").save(str(root / "colbert"))
    return {"splade": root / "splade", "colbert": root / "colbert"}


def _engine_run(
    engine: Engine, encoder: TextEncoder, texts: list[str], output: str
) -> tuple[list[tuple[np.ndarray, ...]], int]:
    """Per chunk the ragged rows (sparse: offsets, indices, values; multivector: offsets, vectors), and
    the tokens embedded."""
    ids = encoder.encode(texts)
    spec = engine.info.multivector
    drop = np.asarray(spec.skiplist_ids, dtype=np.int32) if spec is not None and spec.skiplist_ids else None
    made: list[tuple[np.ndarray, ...]] = []
    for c in pack_chunks(ids, BUDGET, MAX_ROWS):
        out = engine.step(c.input_ids, c.cu_seqlens, outputs=(output,)).result()[output]
        if output == "sparse":
            made.append(sparse_rows(out))
        else:
            made.append(token_rows(out, c.input_ids, c.cu_seqlens, drop_ids=drop))
    return made, sum(len(i) for i in ids)


def _least_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)).min())


def compare(kind: str, folder: Path, texts: list[str], rounds: int) -> dict:
    info = load_model_info(str(folder))
    encoder = TextEncoder(info)
    engine = Engine(info, "cpu")
    output = "sparse" if kind == "splade" else "multivector"
    if kind == "splade":
        from sentence_transformers import SparseEncoder

        sparse = SparseEncoder(str(folder), device="cpu")

        def ref_run():
            return sparse.encode(texts, batch_size=32, convert_to_tensor=True).to_dense().numpy()
    else:
        from sentence_transformers import MultiVectorEncoder

        multivector = MultiVectorEncoder(str(folder), device="cpu")

        def ref_run():
            return [v.numpy() for v in multivector.encode_document(texts, batch_size=32)]

    made, tokens = _engine_run(engine, encoder, texts, output)
    want = ref_run()
    if kind == "splade":
        dense = np.zeros((len(texts), info.vocab_size), np.float32)
        row = 0
        for offsets, indices, values in made:
            for i in range(len(offsets) - 1):
                dense[row, indices[offsets[i] : offsets[i + 1]]] = values[offsets[i] : offsets[i + 1]]
                row += 1
        same = bool(np.array_equal(dense > 0, want > 0))
        cosine = _least_cosine(dense, want)
        entries = float(np.mean((dense > 0).sum(1)))
        wire = {"float32": 8 * entries, "float16": 6 * entries}
    else:
        rows = [r[o[i] : o[i + 1]] for o, r in made for i in range(len(o) - 1)]
        same = all(a.shape == b.shape for a, b in zip(rows, want))
        cosine = min(_least_cosine(a, b) for a, b in zip(rows, want))
        per_input = float(np.mean([len(r) for r in rows]))
        width = rows[0].shape[1]
        wire = {
            "float32": 4 * width * per_input,
            "float16": 2 * width * per_input,
            "int8": width * per_input,
            "binary": -(-width // 8) * per_input,
        }
    engine_s, ref_s, tokenize_s = [], [], []
    for _ in range(rounds):
        t = time.perf_counter()
        _engine_run(engine, encoder, texts, output)
        engine_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        encoder.encode(texts)
        tokenize_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        ref_run()
        ref_s.append(time.perf_counter() - t)
    engine_time, ref_time = statistics.median(engine_s), statistics.median(ref_s)
    return {
        "kind": kind,
        "tokens": tokens,
        "engine": tokens / engine_time,
        "reference": tokens / ref_time,
        "tokenize_share": statistics.median(tokenize_s) / engine_time,
        "same": same,
        "cosine": cosine,
        "wire": wire,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the workload's texts")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    texts = workloads(args.scale)["medium"].texts
    print(f"medium workload: {len(texts)} texts; {torch.get_num_threads()} torch threads; rounds {args.rounds}")
    print(
        f"{'output':10} {'tokens':>7} {'reference tok/s':>16} {'engine tok/s':>13} {'ratio':>6} {'same set/shape':>15} "
        f"{'least cos':>10}  wire bytes per input"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for kind, folder in _folders(Path(tmp)).items():
            r = compare(kind, folder, texts, args.rounds)
            wire = ", ".join(f"{form} {size:,.0f}" for form, size in r["wire"].items())
            print(
                f"{kind:10} {r['tokens']:>7} {r['reference']:>16,.0f} {r['engine']:>13,.0f} "
                f"{r['engine'] / r['reference']:>5.2f}x {r['same']!s:>15} {r['cosine']:>10.6f}  {wire}"
            )


if __name__ == "__main__":
    main()
