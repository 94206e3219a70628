"""Start-up calibration: tokens/s at batch budgets 64..8192 on this device, and the knee.

Small encoders cost about their number of tokens, so throughput climbs with the batch until the
device saturates; past the knee a bigger batch only adds latency. The knee is the smallest
budget within ``tolerance`` of the best throughput measured.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from embedfleet.services.gpu_worker.engine.engine import Engine

log = logging.getLogger("embedfleet.engine")

BUDGETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
ROW_TOKENS = 128  # tokens a row of the synthetic batches: a passage, as bulk work sends them


@dataclass(frozen=True, slots=True)
class Calibration:
    points: list[tuple[int, float]]  # (token budget, tokens/s)
    knee: int

    def describe(self) -> str:
        curve = ", ".join(f"{b}: {t:,.0f}" for b, t in self.points)
        return f"knee at {self.knee} tokens (tokens/s by budget: {curve})"


def synthetic_batch(engine: Engine, tokens: int, seq_len: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``tokens`` tokens in rows of ``seq_len`` (the last row shorter), ids drawn from the vocabulary."""
    rng = np.random.default_rng(seed)
    lengths = [seq_len] * (tokens // seq_len) + ([tokens % seq_len] if tokens % seq_len else [])
    cu = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    ids = rng.integers(1000, engine.spec.vocab_size, size=tokens, dtype=np.int32)
    return ids, cu


def measure(engine: Engine, tokens: int, seq_len: int, min_seconds: float) -> float:
    """Steady tokens/s of batches of ``tokens`` tokens (one warm-up step first)."""
    ids, cu = synthetic_batch(engine, tokens, seq_len)
    engine.embed(ids, cu)  # warm-up (and graph capture on CUDA)
    runs, start = 0, time.perf_counter()
    while True:
        engine.embed(ids, cu)
        runs += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds and runs >= 2:
            return runs * tokens / elapsed


def calibrate(
    engine: Engine,
    budgets: tuple[int, ...] = BUDGETS,
    min_seconds: float = 0.15,
) -> Calibration:
    seq_len = min(ROW_TOKENS, engine.max_seq_length)
    points: list[tuple[int, float]] = []
    best, flat = 0.0, 0
    for budget in budgets:
        if budget > engine.max_batch_tokens or len(range(0, budget, seq_len)) > engine.max_batch_seqs:
            break
        rate = measure(engine, budget, seq_len, min_seconds)
        points.append((budget, rate))
        # saturated: two budgets in a row without beating the best by 3%
        flat = flat + 1 if rate < 1.03 * best else 0
        best = max(best, rate)
        if flat == 2:
            break
    return Calibration(points, pick_knee(points))


def pick_knee(points: list[tuple[int, float]], tolerance: float = 0.95) -> int:
    """The smallest budget whose throughput is within ``tolerance`` of the best."""
    best = max(rate for _, rate in points)
    return min(budget for budget, rate in points if rate >= tolerance * best)
