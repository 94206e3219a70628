"""Building the worker's engines: replicas, thread counts, the calibrated token budget."""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from embedfleet.services.gpu_worker.calibration_cache import FOLDER, CalibrationCache, identity
from embedfleet.services.gpu_worker.config import WorkerConfig
from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.engine.calibrate import BUSY, budgets_for, calibrate
from embedfleet.services.gpu_worker.engine.engine import pick_device
from embedfleet.shared.config.registry import arguments
from embedfleet.shared.parent_death import die_with_parent

log = logging.getLogger("embedfleet.worker")


def replica_threads(count: int) -> list[ThreadPoolExecutor]:
    """One thread per replica, on which everything torch does for it runs, building included.

    On CPU this matters: each thread that runs parallel torch ops gets its own OpenMP team, and
    once there are more team threads than cores, GNU OpenMP stops spinning between parallel regions
    and every op pays a wake-up (tens of microseconds; a small batch's forward ~60% slower). Building
    the engines on the replica's thread, not on the main one, keeps a single team.
    """
    return [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"replica-{i}") for i in range(count)]


def build_engines(cfg: WorkerConfig) -> list[Engine]:
    """One engine per replica (weights shared), configured with the given or calibrated budget."""
    device = pick_device(cfg.device)
    if device.type == "cpu" and cfg.threads:
        torch.set_num_threads(cfg.threads)  # otherwise torch's default: all cores, or $OMP_NUM_THREADS
    first = Engine(
        cfg.model,
        str(device),
        cfg.dtype,
        graphs=cfg.graphs,
        attention=cfg.attention,
        # the first (calibration) configuration takes the largest budget timed; the knee replaces it
        max_batch_tokens=cfg.max_batch_tokens or max(budgets_for(device.type)),
        max_batch_seqs=cfg.max_batch_seqs,
    )
    if cfg.max_batch_tokens is None:
        first.configure(calibrated_budget(first, cfg.data_dir), cfg.max_batch_seqs)
    else:
        log.info("token budget %d (set by --max-batch-tokens)", cfg.max_batch_tokens)
    engines = [first] + [first.replicate() for _ in range(cfg.replicas - 1)]
    log.info("engine: %s; %d replica(s)", first.describe(), len(engines))
    return engines


def calibrated_budget(engine: Engine, data_dir: Path) -> int:
    """The token budget calibrated for ``engine``: the one kept in ``data_dir`` for its model, device
    and dtype, else measured now (and kept there)."""
    cache = CalibrationCache(data_dir / FOLDER)
    key = identity(engine)
    with cache.lock(key):
        cached = cache.load(key)
        if cached is not None:
            budget = max(cached.calibration.knee, engine.info.max_seq_length)
            log.info(
                "token budget %d from the calibration cached in %s, measured at %s on %s (delete the file to measure "
                "again): %s",
                budget,
                cached.path,
                cached.measured_at,
                cached.device,
                cached.calibration.describe(),
            )
            return budget
        result = calibrate(engine, budgets_for(engine.device.type))
        kept = cache.store(key, result)
    budget = max(result.knee, engine.info.max_seq_length)
    log.info(
        "calibrated token budget %d on %s: %s%s",
        budget,
        key["device"],
        result.describe(),
        f"; kept in {kept}" if kept else "",
    )
    if result.disturbance > BUSY:
        log.warning(
            "the device was busy while it was timed (a budget's median probe %.0f%% below its fastest): the token "
            "budget may not be the one a quiet device gets; %s, or pin one with --max-batch-tokens",
            100 * result.disturbance,
            f"delete {kept} to time it again" if kept else "start again to time it again",
        )
    return budget


def run_cpu_processes(cfg: WorkerConfig, ns: argparse.Namespace) -> int:
    """CPU replicas as processes sharing the cores: ``--replicas N`` starts N single-replica workers,
    given the options of ``ns`` (the environment they inherit gives the rest)."""
    threads = cfg.cpu_threads()
    # each child is a single replica with its share of the cores, and its own metrics port
    # (--metrics-port P: the i-th child serves on P + i)
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "embedfleet.services.cli",
                "worker",
                *arguments(
                    ns,
                    "worker",
                    replicas=1,
                    threads=threads,
                    metrics_port=cfg.metrics.port + i if cfg.metrics.enabled else cfg.metrics.port,
                ),
            ],
            preexec_fn=die_with_parent(),
        )  # killed outright, this process takes its replicas along
        for i in range(cfg.replicas)
    ]
    log.info("started %d CPU worker processes with %d threads each", len(children), threads)

    def forward(sig: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [child.wait() for child in children]
    return max(codes, key=abs)


def is_cpu(cfg: WorkerConfig) -> bool:
    return pick_device(cfg.device).type == "cpu"
