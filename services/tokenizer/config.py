"""Tokenizer service configuration, built once from CLI flags and EMBEDFLEET_* variables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import json
import os

from shared.config import (
    ConfigError, JobSettings, NatsConfig, add_job_arguments, add_option, job_settings, nats_config, positive_int,
)
from shared.metrics_server import MetricsEndpoint, add_arguments as add_metrics_arguments
from shared.tracing import TracingConfig
from shared.model_dir import ModelInfo, load_model_info


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--chunk-tokens", "EMBEDFLEET_CHUNK_TOKENS", 8192, "max tokens per batch sent to a worker", positive_int)
    add_option(parser, "--chunk-seqs", "EMBEDFLEET_CHUNK_SEQS", 256, "max sequences per batch sent to a worker", positive_int)
    add_option(parser, "--prompts", "EMBEDFLEET_PROMPTS", "",
               'prompts by input type, as JSON: {"query": "query: ", "document": "passage: "} (added to the model\'s own)')
    add_option(parser, "--threads", "EMBEDFLEET_TOKENIZER_THREADS", None, "tokenizer threads (default: all cores)", positive_int)
    add_option(parser, "--routing", "EMBEDFLEET_ROUTING", "load",
               "load: each batch to the least-loaded live worker; queue: the workers' shared queue group",
               choices=("load", "queue"))
    add_option(parser, "--bulk-ahead", "EMBEDFLEET_BULK_AHEAD", 256,
               "bulk token batches the tokenizers may queue ahead of the workers before they wait", positive_int)
    add_job_arguments(parser)
    add_metrics_arguments(parser)


@dataclass(frozen=True, slots=True)
class TokenizerConfig:
    nats: NatsConfig
    model: ModelInfo
    chunk_tokens: int
    chunk_seqs: int
    prompts: dict[str, str] | None = None
    threads: int | None = None
    routing: str = "load"
    bulk_ahead: int = 256
    jobs: JobSettings = JobSettings()
    metrics: MetricsEndpoint = MetricsEndpoint()
    tracing: TracingConfig = TracingConfig()  # spans over OTLP (--otlp-endpoint), else only passed on

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> TokenizerConfig:
        return cls(
            nats=nats_config(ns),
            model=load_model_info(ns.model, ns.model_name),
            chunk_tokens=ns.chunk_tokens,
            chunk_seqs=ns.chunk_seqs,
            prompts=parse_prompts(ns.prompts),
            threads=ns.threads,
            routing=ns.routing,
            bulk_ahead=ns.bulk_ahead,
            jobs=job_settings(ns),
            metrics=MetricsEndpoint.from_namespace(ns),
            tracing=TracingConfig.from_namespace(ns),
        )

    def apply_threads(self) -> None:
        """The tokenizers library sizes its thread pool from the environment, once, on first use."""
        if self.threads:
            os.environ["RAYON_NUM_THREADS"] = str(self.threads)


def parse_prompts(text: str) -> dict[str, str]:
    if not text:
        return {}
    try:
        prompts = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--prompts is not JSON: {exc}") from None
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ConfigError('--prompts must be a JSON object of strings, like {"query": "query: "}')
    return prompts
