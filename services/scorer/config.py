"""Scorer configuration, built once from CLI flags and EMBEDFLEET_* variables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from shared.config import ConfigError, NatsConfig, add_option, nats_config, positive_int
from shared.metrics_server import MetricsEndpoint, add_arguments as add_metrics_arguments
from shared.tracing import TracingConfig
from shared.model_dir import ModelInfo, load_model_info


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--max-concurrency", "EMBEDFLEET_SCORER_CONCURRENCY", 64, "rerank requests handled at once", positive_int)
    add_option(parser, "--split", "EMBEDFLEET_SCORER_SPLIT", 32,
               "candidates per part: a rerank's parts are scored at once, spread over the workers", positive_int)
    add_metrics_arguments(parser)


@dataclass(frozen=True, slots=True)
class ScorerConfig:
    nats: NatsConfig
    model: ModelInfo
    max_concurrency: int
    split: int = 32
    metrics: MetricsEndpoint = MetricsEndpoint()
    tracing: TracingConfig = TracingConfig()  # spans over OTLP (--otlp-endpoint), else only passed on

    def __post_init__(self) -> None:
        if self.model.scores and self.model.dim != 1:
            raise ConfigError(f"{self.model.id} has {self.model.dim} labels: reranking needs a one-label cross-encoder")

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> ScorerConfig:
        return cls(nats=nats_config(ns), model=load_model_info(ns.model, ns.model_name), max_concurrency=ns.max_concurrency,
                   split=ns.split, metrics=MetricsEndpoint.from_namespace(ns), tracing=TracingConfig.from_namespace(ns))
