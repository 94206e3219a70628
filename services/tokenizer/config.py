"""Tokenizer service configuration, built once from CLI flags and EMBEDFLEET_* variables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import json
import os

from shared.config import ConfigError, JobSettings, NatsConfig, job_settings, nats_config
from shared.metrics_server import MetricsEndpoint
from shared.options import default
from shared.tracing import TracingConfig
from shared.model_dir.info import ModelInfo
from shared.model_dir.load import load_model_info


@dataclass(frozen=True, slots=True)
class TokenizerConfig:
    nats: NatsConfig
    model: ModelInfo
    chunk_tokens: int
    chunk_seqs: int
    prompts: dict[str, str] | None = None
    threads: int | None = default("threads", "tokenizer")  # None: all cores
    routing: str = default("routing")
    bulk_ahead: int = default("bulk_ahead")
    fast_tokenizer: str = default("fast_tokenizer")  # auto: kitoken where it matches tokenizers (fast_check)
    max_chunks: int = default("max_chunks")  # chunks a request's texts may be cut into (a ChunkRequest)
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
            fast_tokenizer=ns.fast_tokenizer,
            max_chunks=ns.max_chunks,
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
