"""The codec's cost on the hot messages, against msgspec's typed msgpack structs, in one run.

    python3 -m bench.protocol            # needs msgspec for the comparison (pip install msgspec)

Per message: microseconds for one encode plus one checked decode, best of several rounds, for
shared/protocol's codec and for the same message as a msgspec Struct (bench/protocol_msgspec.py: wire
keys as field names, the same checks: types and bounds by msgspec, the array invariants in
__post_init__, arrays through enc_hook / dec_hook), and their ratio. The messages: a TokenChunk of
32 x 128 tokens, an EmbedResult of 32 x 384 float32 and a JobBatch of 64 texts of about 300 characters.
docs/protocol.md records a run.
"""

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from embedfleet.shared.protocol import (
    EmbedOptions,
    EmbedResult,
    JobBatch,
    TokenChunk,
    decode_as,
    encode,
)

ROWS, TOKENS, DIM, TEXTS = 32, 128, 384, 64


def messages() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    cu = np.arange(0, ROWS * TOKENS + 1, TOKENS, dtype="<i4")
    ids = rng.integers(0, 30_000, ROWS * TOKENS, dtype=np.int32)
    words = [
        "the",
        "of",
        "a",
        "to",
        "in",
        "is",
        "for",
        "on",
        "that",
        "with",
        "as",
        "by",
        "at",
        "from",
        "this",
        "be",
        "an",
        "are",
    ]
    texts = [" ".join(rng.choice(words, 80)) for _ in range(TEXTS)]
    return {
        "TokenChunk 32x128": TokenChunk(
            "req-1", "all-MiniLM-L6-v2", 0, ROWS, ids, cu, time.time() + 30, timings={"tokenize": 0.001}
        ),
        "EmbedResult 32x384 f4": EmbedResult(
            "req-1",
            0,
            ROWS,
            DIM,
            "f4",
            rng.random((ROWS, DIM), "<f4").tobytes(),
            ROWS * TOKENS,
            {"tokenize": 0.001, "queue": 0.002, "inference": 0.01},
        ),
        "JobBatch 64 texts": JobBatch(
            "job1",
            0,
            "all-MiniLM-L6-v2",
            [f"doc-{i}" for i in range(TEXTS)],
            texts,
            EmbedOptions(input_type="document"),
        ),
    }


def timed(fn: Callable[[], object], rounds: int = 7, number: int = 2000) -> float:
    """Best microseconds per call over ``rounds`` of ``number`` calls."""
    best = math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best * 1e6


def _codec_round(msg: Any) -> Callable[[], object]:
    """One encode and one checked decode of ``msg`` through shared/protocol's codec."""
    return lambda: decode_as(encode(msg), type(msg))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=2000, help="calls a round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds, of which the best counts")
    args = parser.parse_args()
    others: dict[str, Callable[[Any], Callable[[], object]]] = {}
    try:
        from bench.protocol_msgspec import msgspec_codecs  # needs msgspec, optional

        others = msgspec_codecs()
    except ImportError:
        print("msgspec is not installed: the codec alone")
    print(f"{'message':<24}{'bytes':>8}{'codec µs':>11}{'msgspec µs':>12}{'codec/msgspec':>15}")
    for name, msg in messages().items():
        data = encode(msg)
        ours = timed(_codec_round(msg), args.rounds, args.number)
        line = f"{name:<24}{len(data):>8}{ours:>11.1f}"
        if name in others:
            theirs = timed(others[name](msg), args.rounds, args.number)
            line += f"{theirs:>12.1f}{ours / theirs:>15.2f}"
        print(line)


if __name__ == "__main__":
    main()
