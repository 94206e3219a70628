"""Gateway configuration, built once from CLI flags and EMBEDFLEET_* variables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from shared.config import (
    ConfigError, NatsConfig, Retention, add_option, add_retention_arguments, nats_config, non_negative_int, positive_float,
    positive_int, retention,
)
from shared.metrics_server import MetricsEndpoint, add_arguments as add_metrics_arguments
from shared.tracing import TracingConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--host", "EMBEDFLEET_HOST", "127.0.0.1", "address to listen on")
    add_option(parser, "--port", "EMBEDFLEET_PORT", 8080, "HTTP port", int)
    add_option(parser, "--request-timeout", "EMBEDFLEET_REQUEST_TIMEOUT", 30.0, "seconds a request may take", positive_float)
    add_option(parser, "--retries", "EMBEDFLEET_RETRIES", 2,
               "times the rows a dead tokenizer or worker held are sent again (embedding is idempotent)", non_negative_int)
    add_option(parser, "--max-inputs", "EMBEDFLEET_MAX_INPUTS", 2048, "max inputs in one request", positive_int)
    add_option(parser, "--max-input-chars", "EMBEDFLEET_MAX_INPUT_CHARS", 65536, "max characters in one input", positive_int)
    add_option(parser, "--max-body-bytes", "EMBEDFLEET_MAX_BODY_BYTES", 8 << 20, "max request body size in bytes", positive_int)
    add_option(parser, "--max-in-flight", "EMBEDFLEET_MAX_IN_FLIGHT", 512,
               "requests handled at once; more are answered 429 at once", positive_int)
    add_option(parser, "--api-keys", "EMBEDFLEET_API_KEYS", "", "accepted API keys (Bearer), comma separated; none: no auth")
    add_option(parser, "--api-keys-file", "EMBEDFLEET_API_KEYS_FILE", None, "file with one accepted API key per line")
    add_option(parser, "--key-requests-per-minute", "EMBEDFLEET_KEY_REQUESTS_PER_MINUTE", 0,
               "requests each API key may make a minute (429 with Retry-After beyond); 0: no limit", non_negative_int)
    add_option(parser, "--key-tokens-per-minute", "EMBEDFLEET_KEY_TOKENS_PER_MINUTE", 0,
               "tokens each API key may have embedded a minute (429 with Retry-After beyond); 0: no limit",
               non_negative_int)
    add_option(parser, "--open-paths", "EMBEDFLEET_OPEN_PATHS", "/health,/metrics",
               "paths served without an API key, comma separated")
    add_option(parser, "--jobs-dir", "EMBEDFLEET_JOBS_DIR", None,
               "folder whose files POST /v1/jobs may name as 'path' (default: none, server-side files are refused)")
    add_option(parser, "--default-model", "EMBEDFLEET_DEFAULT_MODEL", None,
               "the served model that requests naming none use (TEI routes); default: the first served id in order "
               "(embedfleet up: its first --model)")
    add_metrics_arguments(parser)
    add_retention_arguments(parser)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    nats: NatsConfig
    host: str
    port: int
    request_timeout: float
    max_inputs: int
    max_body_bytes: int
    max_input_chars: int = 65536
    max_in_flight: int = 512
    api_keys: tuple[str, ...] = ()
    key_requests_per_minute: int = 0  # per API key; 0: no limit
    key_tokens_per_minute: int = 0
    open_paths: tuple[str, ...] = ("/health", "/metrics")
    jobs_dir: Path | None = None
    discovery_interval: float = 1.0  # seconds between fleet polls; a process silent for 3 is taken for dead
    retries: int = 2  # attempts after the first for rows a dead process may have held
    discovery_wait: float = 0.25  # seconds to gather ping replies
    default_model: str | None = None  # None: the first model served, by id
    metrics: MetricsEndpoint = MetricsEndpoint()  # besides /metrics on the HTTP port
    tracing: TracingConfig = TracingConfig()  # spans over OTLP (--otlp-endpoint), else only passed on
    retention: Retention = Retention()  # set on the results stream and job bucket the gateway meets

    def __post_init__(self) -> None:
        if self.default_model is not None and not self.default_model.strip():
            raise ConfigError("--default-model must name a model")
        if (self.key_requests_per_minute or self.key_tokens_per_minute) and not self.api_keys:
            raise ConfigError("--key-requests-per-minute and --key-tokens-per-minute limit each API key: give the keys "
                              "(--api-keys or --api-keys-file)")

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> GatewayConfig:
        return cls(
            nats=nats_config(ns),
            host=ns.host,
            port=ns.port,
            request_timeout=ns.request_timeout,
            max_inputs=ns.max_inputs,
            max_body_bytes=ns.max_body_bytes,
            max_input_chars=ns.max_input_chars,
            max_in_flight=ns.max_in_flight,
            retries=ns.retries,
            api_keys=api_keys(ns),
            key_requests_per_minute=ns.key_requests_per_minute,
            key_tokens_per_minute=ns.key_tokens_per_minute,
            open_paths=tuple(p.strip() for p in ns.open_paths.split(",") if p.strip()),
            jobs_dir=Path(ns.jobs_dir).resolve() if ns.jobs_dir else None,
            default_model=ns.default_model,
            metrics=MetricsEndpoint.from_namespace(ns),
            tracing=TracingConfig.from_namespace(ns),
            retention=retention(ns),
        )


def api_keys(ns: argparse.Namespace) -> tuple[str, ...]:
    """The keys of --api-keys and --api-keys-file (``embedfleet up`` sends one on its readiness checks)."""
    keys = [k.strip() for k in ns.api_keys.split(",") if k.strip()]
    if ns.api_keys_file:
        path = Path(ns.api_keys_file)
        try:
            keys += [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
        except OSError as exc:
            raise ConfigError(f"--api-keys-file {path}: {exc.strerror}") from None
        if not keys:
            raise ConfigError(f"--api-keys-file {path} holds no key")
    return tuple(keys)
