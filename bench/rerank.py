"""Rerank benchmark on real processes: reranks/s for a query with 100 candidates of ~100 tokens,
through HTTP (POST /v1/rerank) and NATS, against sentence-transformers in-process doing the same
work (embed query + candidates, cosine), alternating in one run.

    python -m bench.rerank [--seconds 15] [--concurrency 1 4]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import httpx
import numpy as np

from bench.fleet import fleet
from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.shared.model_dir.load import load_model_info
from tests.support.corpus import long_texts

MODEL = "all-MiniLM-L6-v2"


def candidates(n: int = 100, tokens: int = 100) -> list[str]:
    """n passages cut to about ``tokens`` tokens each (real text)."""
    encoder = TextEncoder(load_model_info(None))
    out = []
    for text in long_texts(n):  # distinct windows of long documents
        cut = " ".join(text.split()[:90])
        while len(encoder.encode([cut])[0]) > tokens and " " in cut:
            cut = cut.rsplit(" ", 1)[0]
        out.append(cut)
    return out


def _http(base: str, query: str, docs: list[str], seconds: float, concurrency: int) -> tuple[list[float], float]:
    """Latencies of the reranks ``concurrency`` clients finished, and the seconds that took (until
    the last one finished: requests started before the stop are waited for and counted)."""
    lat: list[float] = []
    start = time.perf_counter()
    stop = start + seconds

    def client() -> None:
        with httpx.Client(timeout=120) as c:
            while time.perf_counter() < stop:
                t = time.perf_counter()
                r = c.post(f"{base}/v1/rerank", json={"model": MODEL, "query": query, "documents": docs, "top_n": 10})
                r.raise_for_status()
                lat.append(time.perf_counter() - t)

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lat, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    from sentence_transformers import SentenceTransformer

    docs = candidates()
    query = "how do I read a file line by line"
    tokens = sum(len(s) for s in TextEncoder(load_model_info(None)).encode(docs))
    print(f"one rerank = a query and {len(docs)} candidates, {tokens / len(docs):.0f} tokens each on average")
    reference = SentenceTransformer(str(load_model_info(None).path), device="cpu")

    def st_rerank() -> None:
        v = reference.encode([query, *docs], batch_size=128, normalize_embeddings=True)
        np.argsort(-(v[1:] @ v[0]))[:10]

    with fleet([["--max-batch-tokens", "2048"]], ["--chunk-seqs", "32"], scorer=True) as (base, nats_url):
        from tests.support.procs import count_services, wait_until

        wait_until(lambda: count_services(nats_url, "scorer") == 1, 60, "the scorer")
        _http(base, query, docs, 1.0, 1)  # warm-up
        for rnd in range(2):
            count, t = 0, time.perf_counter()
            while time.perf_counter() - t < args.seconds:
                st_rerank()
                count += 1
            st_rate = count / (time.perf_counter() - t)
            print(f"round {rnd + 1}: sentence-transformers in-process {st_rate:6.2f} reranks/s", flush=True)
            for c in args.concurrency:
                lat, took = _http(base, query, docs, args.seconds, c)
                lat.sort()
                rate = len(lat) / took
                print(
                    f"round {rnd + 1}: embedfleet /v1/rerank, {c} in flight: {rate:6.2f} reranks/s "
                    f"({rate / st_rate:.2f}x), p50 {statistics.median(lat) * 1e3:.0f} ms, "
                    f"p99 {lat[int(len(lat) * 0.99)] * 1e3:.0f} ms",
                    flush=True,
                )


if __name__ == "__main__":
    main()
