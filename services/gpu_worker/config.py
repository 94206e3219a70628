"""Worker configuration, built once from CLI flags and EMBEDFLEET_* variables."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.config.registry import from_options, setting
from embedfleet.shared.jobs.settings import JobSettings, job_settings
from embedfleet.shared.model_dir.info import ModelInfo
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.nats.config import NatsConfig, nats_config
from embedfleet.shared.observability.metrics_server import MetricsEndpoint
from embedfleet.shared.observability.tracing import TracingConfig


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    nats: NatsConfig
    model: ModelInfo
    device: str = setting("device")
    dtype: str | None = setting("dtype")
    max_batch_tokens: int | None = setting("max_batch_tokens")  # None: calibrate
    data_dir: Path = setting("data_dir", "worker", convert=Path)  # the calibration kept in its calibration/
    max_batch_seqs: int = setting("max_batch_seqs")
    replicas: int = setting("replicas")
    threads: int | None = setting("threads", "worker")
    # None: on where CUDA and the attention backend allow
    graphs: bool | None = setting("graphs", convert=lambda given: {"auto": None, "on": True, "off": False}[given])
    attention: str = setting("attention")
    load_interval: float = setting("load_interval")
    load_idle_interval: float = setting("load_idle_interval")
    jobs: JobSettings = JobSettings()
    bulk_batch_tokens: int | None = setting("bulk_batch_tokens")  # None: max_batch_tokens
    max_queued_tokens: int = setting("max_queued_tokens")
    metrics: MetricsEndpoint = MetricsEndpoint()  # CPU replica processes: port + i each (replicas.py)
    tracing: TracingConfig = TracingConfig()  # spans over OTLP (--otlp-endpoint), else only passed on

    def __post_init__(self) -> None:
        if self.metrics.enabled and self.metrics.port + self.replicas - 1 > 65535:
            raise ConfigError(
                f"--metrics-port {self.metrics.port} with --replicas {self.replicas}: replica processes "
                "on a CPU take one port each from it up, past 65535"
            )
        if self.load_idle_interval < self.load_interval:
            raise ConfigError(
                f"--load-idle-interval {self.load_idle_interval:g} is below --load-interval "
                f"{self.load_interval:g}: an idle worker reports no more often than a busy one"
            )
        if self.max_batch_tokens is not None and self.max_batch_tokens < self.model.max_seq_length:
            raise ConfigError(
                f"--max-batch-tokens {self.max_batch_tokens} is below the model's sequence limit {self.model.max_seq_length}"
            )

    def cpu_threads(self) -> int:
        return self.threads or max(1, (os.cpu_count() or 1) // self.replicas)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> WorkerConfig:
        return from_options(
            cls,
            ns,
            nats=nats_config(ns),
            model=load_model_info(ns.model, ns.model_name),
            jobs=job_settings(ns),
            metrics=MetricsEndpoint.from_namespace(ns),
            tracing=TracingConfig.from_namespace(ns),
        )
