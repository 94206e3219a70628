"""Scorer configuration, built once from CLI flags and EMBEDFLEET_* variables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.config.registry import from_options, setting
from embedfleet.shared.model_dir.info import ModelInfo
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.nats.config import NatsConfig, nats_config
from embedfleet.shared.observability.metrics_server import MetricsEndpoint
from embedfleet.shared.observability.tracing import TracingConfig


@dataclass(frozen=True, slots=True)
class ScorerConfig:
    nats: NatsConfig
    model: ModelInfo
    max_concurrency: int = setting("max_concurrency")
    split: int = setting("split")
    discovery_interval: float = setting("discovery_interval")  # seconds between pings of the fleet
    discovery_wait: float = setting("discovery_wait")
    metrics: MetricsEndpoint = MetricsEndpoint()
    tracing: TracingConfig = TracingConfig()  # spans over OTLP (--otlp-endpoint), else only passed on

    def __post_init__(self) -> None:
        if self.model.scores and self.model.dim != 1:
            raise ConfigError(f"{self.model.id} has {self.model.dim} labels: reranking needs a one-label cross-encoder")

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> ScorerConfig:
        return from_options(
            cls,
            ns,
            nats=nats_config(ns),
            model=load_model_info(ns.model, ns.model_name),
            metrics=MetricsEndpoint.from_namespace(ns),
            tracing=TracingConfig.from_namespace(ns),
        )
