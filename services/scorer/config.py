"""Scorer configuration, built once from CLI flags and EMBEDFLEET_* variables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from shared.config import ConfigError, NatsConfig, nats_config
from shared.metrics_server import MetricsEndpoint
from shared.options import default
from shared.tracing import TracingConfig
from shared.model_dir.info import ModelInfo
from shared.model_dir.load import load_model_info


@dataclass(frozen=True, slots=True)
class ScorerConfig:
    nats: NatsConfig
    model: ModelInfo
    max_concurrency: int
    split: int = default("split")
    discovery_interval: float = default("discovery_interval")  # seconds between pings of the fleet
    discovery_wait: float = default("discovery_wait")
    metrics: MetricsEndpoint = MetricsEndpoint()
    tracing: TracingConfig = TracingConfig()  # spans over OTLP (--otlp-endpoint), else only passed on

    def __post_init__(self) -> None:
        if self.model.scores and self.model.dim != 1:
            raise ConfigError(f"{self.model.id} has {self.model.dim} labels: reranking needs a one-label cross-encoder")

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> ScorerConfig:
        return cls(nats=nats_config(ns), model=load_model_info(ns.model, ns.model_name), max_concurrency=ns.max_concurrency,
                   split=ns.split, discovery_interval=ns.discovery_interval, discovery_wait=ns.discovery_wait,
                   metrics=MetricsEndpoint.from_namespace(ns), tracing=TracingConfig.from_namespace(ns))
