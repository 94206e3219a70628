"""What chunking costs: long documents embedded whole-but-truncated against cut into chunks, one run.

    python -m bench.chunking [--rounds 2] [--seconds 10] [--documents 64] [--size 128] [--overlap 16]
    python -m bench.chunking --smoke      # every mode once, at tiny durations (the test)

The stack (nats-server, tokenizer, worker, gateway as processes) serves all-MiniLM-L6-v2; documents of
about 1,000 tokens, ``--per-request`` a request, ``--in-flight`` requests in flight. Modes, alternating
round by round on the same stack:

- ``truncate``: no chunking; the model sees each document's first 256 tokens, the rest is dropped;
- ``chunks``: ``chunking`` {size, overlap}, a vector per chunk;
- ``mean``: the same chunks, their token-weighted mean per document;
- ``late``: late chunking (one forward pass per window of the model's limit, token vectors pooled
  over each chunk), a vector per chunk; left out when the stack answers it with an error.

For each: documents/s, the documents' own tokens/s (every token of every document, whether the mode
embeds it or not: what covering a corpus costs), embedded tokens/s (``usage.total_tokens``: what the
worker ran, overlap and repeated special tokens included) and request p50; and each against
``truncate``. Results go to DIR/chunking.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import orjson

from bench.fleet import stack
from embedfleet.shared.model_dir.load import load_model_info
from tests.support.corpus import long_texts

MODEL = "all-MiniLM-L6-v2"
MODES = ("truncate", "chunks", "mean", "late")


def documents(n: int) -> list[str]:
    """``n`` documents of about 1,000 tokens: the corpus's long texts, cut at a space after 5,000 characters."""
    return [t[: t.find(" ", 5000)] if len(t) > 5000 and " " in t[5000:] else t for t in long_texts(n)]


def body(mode: str, batch: list[str], size: int, overlap: int) -> bytes:
    doc: dict = {"model": MODEL, "input": batch}
    if mode != "truncate":
        doc["chunking"] = {
            "size": size,
            "overlap": overlap,
            "late": mode == "late",
            "return": "mean" if mode == "mean" else "chunks",
        }
    return orjson.dumps(doc)


async def drive(url: str, mode: str, docs: list[str], args: argparse.Namespace, seconds: float) -> dict:
    """``args.in_flight`` clients send ``args.per_request`` documents a request for ``seconds``; the
    first error answer raises (a mode the stack refuses is reported, not measured)."""
    import aiohttp

    latencies: list[float] = []
    counts = {"documents": 0, "embedded_tokens": 0, "vectors": 0}
    start = time.perf_counter()
    stop = start + seconds
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=args.in_flight), timeout=aiohttp.ClientTimeout(total=600)
    ) as client:

        async def one(k: int) -> None:
            i = k * args.per_request
            while time.perf_counter() < stop:
                batch = [docs[(i + j) % len(docs)] for j in range(args.per_request)]
                i += args.in_flight * args.per_request
                t = time.perf_counter()
                async with client.post(
                    url, data=body(mode, batch, args.size, args.overlap), headers={"content-type": "application/json"}
                ) as r:
                    answer = await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{mode}: HTTP {r.status}: {answer[:300]!r}")
                latencies.append(time.perf_counter() - t)
                doc = orjson.loads(answer)
                counts["documents"] += len(batch)
                counts["embedded_tokens"] += doc["usage"]["total_tokens"]
                counts["vectors"] += len(doc["data"])

        await asyncio.gather(*(one(k) for k in range(args.in_flight)))
    took = time.perf_counter() - start
    return {**counts, "seconds": took, "p50_ms": statistics.median(latencies) * 1e3}


def document_tokens(docs: list[str]) -> dict[str, int]:
    """Each document's own tokens, untruncated (special tokens left out)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(load_model_info(None).path / "tokenizer.json"))
    tok.no_truncation()
    return {d: len(e.ids) for d, e in zip(docs, tok.encode_batch(docs, add_special_tokens=False))}


def run(args: argparse.Namespace) -> dict:
    docs = documents(args.documents)
    own = document_tokens(docs)
    mean_tokens = statistics.mean(own.values())
    rounds: dict[str, list[dict]] = {m: [] for m in MODES}
    refused: dict[str, str] = {}
    with stack([[]], []) as base:
        url = f"{base}/v1/embeddings"
        for r in range(args.rounds):
            for mode in MODES:
                if mode in refused:
                    continue
                try:
                    asyncio.run(drive(url, mode, docs, args, args.warm_up))
                    result = asyncio.run(drive(url, mode, docs, args, args.seconds))
                except RuntimeError as exc:
                    refused[mode] = str(exc)
                    print(f"  {mode}: not measured ({exc})", flush=True)
                    continue
                result["document_tokens"] = result["documents"] * mean_tokens
                rounds[mode].append(result)
                print(
                    f"  round {r + 1} {mode:<9} {result['documents'] / result['seconds']:8.1f} docs/s "
                    f"{result['embedded_tokens'] / result['seconds']:10.0f} embedded tok/s  p50 {result['p50_ms']:.0f} ms",
                    flush=True,
                )
    return {
        "documents": len(docs),
        "mean_document_tokens": mean_tokens,
        "per_request": args.per_request,
        "in_flight": args.in_flight,
        "size": args.size,
        "overlap": args.overlap,
        "rounds": args.rounds,
        "modes": {m: summarize(rs) for m, rs in rounds.items() if rs},
        "refused": refused,
    }


def summarize(results: list[dict]) -> dict:
    """Medians over rounds of each rate."""

    def rate(key: str) -> float:
        return statistics.median(r[key] / r["seconds"] for r in results)

    return {
        "documents_per_s": rate("documents"),
        "document_tokens_per_s": rate("document_tokens"),
        "embedded_tokens_per_s": rate("embedded_tokens"),
        "vectors_per_s": rate("vectors"),
        "p50_ms": statistics.median(r["p50_ms"] for r in results),
    }


def report(data: dict) -> None:
    modes = data["modes"]
    base = modes.get("truncate")
    print(
        f"\n{data['documents']} documents of {data['mean_document_tokens']:.0f} tokens on average, "
        f"{data['per_request']} a request, {data['in_flight']} in flight; chunks of {data['size']} tokens, "
        f"overlap {data['overlap']}; medians of {data['rounds']} round(s)"
    )
    print(
        f"{'mode':<9} {'docs/s':>8} {'doc tok/s':>10} {'embedded tok/s':>15} {'vectors/s':>10} {'p50 ms':>7}  docs/s vs truncate"
    )
    for mode, s in modes.items():
        ratio = f"{s['documents_per_s'] / base['documents_per_s']:.2f}x" if base else "-"
        print(
            f"{mode:<9} {s['documents_per_s']:8.1f} {s['document_tokens_per_s']:10.0f} {s['embedded_tokens_per_s']:15.0f} "
            f"{s['vectors_per_s']:10.1f} {s['p50_ms']:7.0f}  {ratio}"
        )
    for mode, why in data["refused"].items():
        print(f"{mode:<9} not measured: {why}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per mode and round")
    p.add_argument("--warm-up", type=float, default=2.0, help="unmeasured seconds before each")
    p.add_argument("--documents", type=int, default=64)
    p.add_argument("--per-request", type=int, default=4)
    p.add_argument("--in-flight", type=int, default=4)
    p.add_argument("--size", type=int, default=128, help="chunking.size (tokens)")
    p.add_argument("--overlap", type=int, default=16, help="chunking.overlap (tokens)")
    p.add_argument("--out", default="bench/results/chunking", help="folder for chunking.json")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="one round of 1 s a mode on 8 documents, one a request, two requests in flight",
    )
    args = p.parse_args(argv)
    if args.smoke:
        # a request started within the second runs to its end: few and small, so a mode takes seconds
        args.rounds, args.seconds, args.warm_up, args.documents, args.per_request, args.in_flight = 1, 1.0, 0.2, 8, 1, 2
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    data = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chunking.json").write_text(json.dumps(data, indent=2))
    report(data)


if __name__ == "__main__":
    main()
