"""Start-up calibration: tokens/s at batch budgets 64..8192 on a CPU (..32768 on a GPU), and the knee.

Small encoders cost about their number of tokens, so throughput climbs with the batch until the
device saturates; past the knee a bigger batch only adds latency. The knee is the smallest
budget within ``TOLERANCE`` of the best throughput measured.

A CPU's curve is nearly flat (a few percent a doubling past a few hundred tokens), so one timing a
budget, on a machine that other processes share, put the knee anywhere from 256 to 8192 from one
start to the next. So each budget is timed by several short probes, in rounds over all budgets (a
spell of a neighbour's load spreads over every budget, not over the one being timed then), and its
rate is its fastest probe: load only ever slows a probe down. Among near-equal
budgets the smallest wins: on a CPU a bigger batch buys a few percent of throughput for a
proportionally longer wait for every request behind it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from embedfleet.services.gpu_worker.engine.engine import Engine

BUDGETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
# a GPU's curve still rises past 8,192 (BERT-base in float16 on an H200: 1.39M tokens/s at 8,192, 1.60M at
# 16,384; bench/results/gpu/gpu_check-2026-12-04.json)
GPU_BUDGETS = (*BUDGETS, 16384, 32768)
ROW_TOKENS = 128  # tokens a row of the synthetic batches: a passage, as bulk work sends them
ROUNDS = 5  # probes of each budget
TOLERANCE = 0.9  # the knee: the smallest budget with this share of the best rate
BUSY = 0.2  # a disturbance past this: the device was busy while timed (a quiet H200: 0.04-0.12)


def budgets_for(device_type: str) -> tuple[int, ...]:
    """The budgets timed on a device of ``device_type`` ("cpu", "cuda")."""
    return BUDGETS if device_type == "cpu" else GPU_BUDGETS


@dataclass(frozen=True, slots=True)
class Point:
    budget: int
    rates: tuple[float, ...]  # tokens/s of each probe, in the order taken

    @property
    def rate(self) -> float:
        """The fastest probe: the slower ones met a neighbour's load (nothing makes a probe faster than the
        device is). Upward jitter is a percent or two, alike for every budget."""
        return max(self.rates)

    @property
    def median(self) -> float:
        return float(np.median(self.rates))

    @property
    def slowest(self) -> float:
        return min(self.rates)


@dataclass(frozen=True, slots=True)
class Calibration:
    curve: tuple[Point, ...]
    knee: int

    @property
    def points(self) -> list[tuple[int, float]]:
        """(token budget, tokens/s) of each budget measured."""
        return [(p.budget, p.rate) for p in self.curve]

    @property
    def disturbance(self) -> float:
        """How far a budget's median probe fell below its fastest, the median over budgets: near 0 on a
        quiet device; large when the device was busy throughout, and no probe saw it alone."""
        return float(np.median([1 - p.median / p.rate for p in self.curve]))

    def describe(self) -> str:
        probes = "-".join(str(n) for n in sorted({len(p.rates) for p in self.curve}))
        curve = ", ".join(f"{p.budget}: {p.rate:,.0f} ({p.median:,.0f}/{p.slowest:,.0f})" for p in self.curve)
        return (
            f"knee at {self.knee} tokens, the smallest budget within {TOLERANCE:.0%} of the best (tokens/s by "
            f"budget, the fastest (median/slowest) of {probes} probes: {curve})"
        )


def synthetic_batch(engine: Engine, tokens: int, seq_len: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``tokens`` tokens in rows of ``seq_len`` (the last row shorter), ids drawn from the vocabulary."""
    rng = np.random.default_rng(seed)
    lengths = [seq_len] * (tokens // seq_len) + ([tokens % seq_len] if tokens % seq_len else [])
    cu = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    ids = rng.integers(1000, engine.spec.vocab_size, size=tokens, dtype=np.int32)
    return ids, cu


def calibrate(
    engine: Engine,
    budgets: Sequence[int] = BUDGETS,
    min_seconds: float = 0.15,
    rounds: int = ROUNDS,
) -> Calibration:
    """The curve of ``engine`` over the ``budgets`` it can take, each timed for about ``min_seconds``
    over all its probes (each probe runs its batch once at least)."""
    seq_len = min(ROW_TOKENS, engine.max_seq_length)
    usable = [b for b in budgets if b <= engine.max_batch_tokens and len(range(0, b, seq_len)) <= engine.max_batch_seqs]
    batches = {b: synthetic_batch(engine, b, seq_len) for b in usable}
    # no warm-up: the first probe of a budget (oneDNN's primitives made, a CUDA graph captured) is a
    # slow one, and a budget's rate is its fastest
    seconds = min_seconds / rounds

    def probe(budget: int) -> float:
        ids, cu = batches[budget]
        runs, start = 0, time.perf_counter()
        while True:
            engine.embed(ids, cu)
            runs += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return runs * budget / elapsed

    return sweep(probe, usable, rounds)


def sweep(
    probe: Callable[[int], float], budgets: Sequence[int], rounds: int = ROUNDS, tolerance: float = TOLERANCE
) -> Calibration:
    """``rounds`` rounds of ``probe`` (tokens/s of one short timing of a budget) over all ``budgets``,
    smallest first. No budget is left out early: the slow probes that would decide it are the noise."""
    rates: dict[int, list[float]] = {b: [] for b in budgets}
    for _ in range(rounds):
        for budget in budgets:
            rates[budget].append(probe(budget))
    curve = tuple(Point(b, tuple(r)) for b, r in rates.items())
    return Calibration(curve, pick_knee(curve, tolerance))


def pick_knee(curve: Sequence[Point], tolerance: float = TOLERANCE) -> int:
    """The smallest budget whose rate is within ``tolerance`` of the best."""
    best = max(p.rate for p in curve)
    return min(p.budget for p in curve if p.rate >= tolerance * best)
