"""Tokenizer service configuration, built once from CLI flags and EMBEDFLEET_* variables."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.config.registry import from_options, setting
from embedfleet.shared.jobs.settings import JobSettings, job_settings
from embedfleet.shared.model_dir.info import ModelInfo
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.nats.config import NatsConfig, nats_config
from embedfleet.shared.observability.metrics_server import MetricsEndpoint
from embedfleet.shared.observability.tracing import TracingConfig


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


@dataclass(frozen=True, slots=True)
class TokenizerConfig:
    nats: NatsConfig
    model: ModelInfo
    chunk_tokens: int = setting("chunk_tokens")
    chunk_seqs: int = setting("chunk_seqs")
    prompts: dict[str, str] | None = setting("prompts", convert=parse_prompts)
    threads: int | None = setting("threads", "tokenizer")  # None: all cores
    routing: str = setting("routing")
    bulk_ahead: int = setting("bulk_ahead")
    fast_tokenizer: str = setting("fast_tokenizer")  # auto: kitoken where it matches tokenizers (fast_check)
    max_chunks: int = setting("max_chunks")  # chunks a request's texts may be cut into (a ChunkRequest)
    max_document_chars: int = setting("max_document_chars")  # a text cut into chunks, a job's document
    max_image_bytes: int = setting("max_image_bytes")  # one image file (shared/images/decode.py's ImageLimits)
    max_image_pixels: int = setting("max_image_pixels")  # one image's declared width x height
    job_max_result_bytes: int = setting("job_max_result_bytes")  # a chunked job's results, 0: no limit
    jobs: JobSettings = JobSettings()
    metrics: MetricsEndpoint = MetricsEndpoint()
    tracing: TracingConfig = TracingConfig()  # spans over OTLP (--otlp-endpoint), else only passed on

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> TokenizerConfig:
        return from_options(
            cls,
            ns,
            nats=nats_config(ns),
            model=load_model_info(ns.model, ns.model_name),
            jobs=job_settings(ns),
            metrics=MetricsEndpoint.from_namespace(ns),
            tracing=TracingConfig.from_namespace(ns),
        )

    def apply_threads(self) -> None:
        """The tokenizers library sizes its thread pool from the environment, once, on first use."""
        if self.threads:
            os.environ["RAYON_NUM_THREADS"] = str(self.threads)
