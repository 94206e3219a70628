"""Worker configuration, built once from CLI flags and EMBEDFLEET_* variables."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from shared.config import (
    ConfigError, JobSettings, NatsConfig, add_job_arguments, add_option, job_settings, nats_config, positive_float,
    positive_int,
)
from shared.metrics_server import MetricsEndpoint, add_arguments as add_metrics_arguments
from shared.tracing import TracingConfig
from shared.model_dir import ModelInfo, load_model_info


def budget(text: str) -> int | None:
    """'auto' (calibrate at start-up) or a positive number of tokens."""
    return None if text == "auto" else positive_int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--device", "EMBEDFLEET_DEVICE", "auto", "torch device: auto (CUDA when present), cpu, cuda, cuda:N")
    add_option(parser, "--dtype", "EMBEDFLEET_DTYPE", None, "compute dtype (default: float32 on CPU, float16 on CUDA)",
               choices=("float32", "float16", "bfloat16"))
    add_option(parser, "--max-batch-tokens", "EMBEDFLEET_MAX_BATCH_TOKENS", "auto",
               "token budget of one engine batch; 'auto' calibrates it at start-up", budget)
    add_option(parser, "--bulk-batch-tokens", "EMBEDFLEET_BULK_BATCH_TOKENS", None,
               "token budget of engine batches of bulk-job work (default: the token budget); smaller bounds how long "
               "an online request waits behind bulk work on a slow device", positive_int)
    add_option(parser, "--max-batch-seqs", "EMBEDFLEET_MAX_BATCH_SEQS", 256, "max sequences in one engine batch", positive_int)
    add_option(parser, "--replicas", "EMBEDFLEET_REPLICAS", 1,
               "engine replicas: on CUDA, replicas on the one GPU sharing weights; on CPU, processes sharing the cores",
               positive_int)
    add_option(parser, "--threads", "EMBEDFLEET_THREADS", None, "CPU threads per replica (default: all cores, split among replicas)",
               positive_int)
    add_option(parser, "--graphs", "EMBEDFLEET_GRAPHS", "auto", "CUDA graphs: auto (on with CUDA), on, off",
               choices=("auto", "on", "off"))
    add_option(parser, "--attention", "EMBEDFLEET_ATTENTION", "auto", "attention backend",
               choices=("auto", "sdpa", "flashinfer"))
    add_option(parser, "--max-queued-tokens", "EMBEDFLEET_MAX_QUEUED_TOKENS", 262144,
               "online tokens waiting in this worker beyond which new batches are refused (overloaded: 429)", positive_int)
    add_option(parser, "--load-interval", "EMBEDFLEET_LOAD_INTERVAL", 0.05,
               "seconds between queue-depth reports to the tokenizers", positive_float)
    add_job_arguments(parser)
    add_metrics_arguments(parser)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    nats: NatsConfig
    model: ModelInfo
    device: str
    dtype: str | None
    max_batch_tokens: int | None  # None: calibrate
    max_batch_seqs: int
    replicas: int
    threads: int | None
    graphs: bool | None  # None: on where CUDA and the attention backend allow
    attention: str
    load_interval: float = 0.05
    jobs: JobSettings = JobSettings()
    bulk_batch_tokens: int | None = None
    max_queued_tokens: int = 262144
    metrics: MetricsEndpoint = MetricsEndpoint()  # CPU replica processes: port + i each (replicas.py)
    tracing: TracingConfig = TracingConfig()  # spans over OTLP (--otlp-endpoint), else only passed on

    def __post_init__(self) -> None:
        if self.metrics.enabled and self.metrics.port + self.replicas - 1 > 65535:
            raise ConfigError(f"--metrics-port {self.metrics.port} with --replicas {self.replicas}: replica processes "
                              "on a CPU take one port each from it up, past 65535")
        if self.max_batch_tokens is not None and self.max_batch_tokens < self.model.max_seq_length:
            raise ConfigError(
                f"--max-batch-tokens {self.max_batch_tokens} is below the model's sequence limit {self.model.max_seq_length}"
            )

    def cpu_threads(self) -> int:
        return self.threads or max(1, (os.cpu_count() or 1) // self.replicas)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> WorkerConfig:
        return cls(
            nats=nats_config(ns),
            model=load_model_info(ns.model, ns.model_name),
            device=ns.device,
            dtype=ns.dtype,
            max_batch_tokens=ns.max_batch_tokens,
            max_batch_seqs=ns.max_batch_seqs,
            replicas=ns.replicas,
            threads=ns.threads,
            graphs={"auto": None, "on": True, "off": False}[ns.graphs],
            attention=ns.attention,
            load_interval=ns.load_interval,
            jobs=job_settings(ns),
            bulk_batch_tokens=ns.bulk_batch_tokens,
            max_queued_tokens=ns.max_queued_tokens,
            metrics=MetricsEndpoint.from_namespace(ns),
            tracing=TracingConfig.from_namespace(ns),
        )
