"""Gateway configuration, built once from CLI flags and EMBEDFLEET_* variables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from shared.config import ConfigError, NatsConfig, Retention, nats_config, retention
from shared.metrics_server import MetricsEndpoint
from shared.options import default
from shared.tracing import TracingConfig


def comma_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What a client may send before the application sees its request (services/gateway/http_server.py)."""

    max_header_bytes: int = default("max_header_bytes")  # request target and header fields; more: 431
    max_headers: int = default("max_headers")  # header fields; more: 431
    header_timeout: float = default("header_timeout")  # seconds to send the request line and headers; more: 408
    body_timeout: float = default("body_timeout")  # seconds to send the body once the headers are in; more: 408

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> HttpLimits:
        return cls(ns.max_header_bytes, ns.max_headers, ns.header_timeout, ns.body_timeout)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    nats: NatsConfig
    host: str
    port: int
    request_timeout: float
    max_inputs: int
    max_body_bytes: int
    max_input_chars: int = default("max_input_chars")
    max_in_flight: int = default("max_in_flight")
    api_keys: tuple[str, ...] = comma_list(default("api_keys"))  # none: no auth (operator keys are among them)
    operator_keys: tuple[str, ...] = comma_list(default("operator_keys"))  # keys that see every bulk job
    key_requests_per_minute: int = default("key_requests_per_minute")  # per API key; 0: no limit
    key_tokens_per_minute: int = default("key_tokens_per_minute")
    open_paths: tuple[str, ...] = comma_list(default("open_paths"))  # served without an API key
    jobs_dir: Path | None = None
    jobs_max_file_bytes: int = default("jobs_max_file_bytes")
    discovery_interval: float = default("discovery_interval")  # seconds between fleet polls; 3 silent: dead
    retries: int = default("retries")  # attempts after the first for rows a dead process may have held
    discovery_wait: float = default("discovery_wait")  # seconds to gather ping replies
    default_model: str | None = default("default_model")  # None: the first model served, by id
    job_metrics_interval: float = default("job_metrics_interval")  # seconds between reads of the jobs' progress
    metrics: MetricsEndpoint = MetricsEndpoint()  # besides /metrics on the HTTP port
    tracing: TracingConfig = TracingConfig()  # spans over OTLP (--otlp-endpoint), else only passed on
    retention: Retention = Retention()  # set on the results stream and job bucket the gateway meets
    http: HttpLimits = HttpLimits()  # header size and count, slow clients
    search_sink: str | None = None  # the vector store POST /v1/search reads (shared/sinks); None: not served
    search_model: str | None = None  # the model whose vectors it holds; None: the request's model, else the default
    job_sinks: tuple[str, ...] = comma_list(default("job_sinks"))  # the stores POST /v1/jobs may write into ("sink"); none: jobs write into none

    def __post_init__(self) -> None:
        if self.default_model is not None and not self.default_model.strip():
            raise ConfigError("--default-model must name a model")
        if self.search_model is not None and self.search_sink is None:
            raise ConfigError("--search-model names the model of the --search-sink store's vectors: give --search-sink")
        if self.search_sink is not None:
            _check_sink(self.search_sink, "--search-sink")
        for url in self.job_sinks:
            _check_sink(url, "--job-sinks")
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
            api_keys=tuple(dict.fromkeys(api_keys(ns) + operator_keys(ns))),
            operator_keys=operator_keys(ns),
            key_requests_per_minute=ns.key_requests_per_minute,
            key_tokens_per_minute=ns.key_tokens_per_minute,
            open_paths=comma_list(ns.open_paths),
            discovery_interval=ns.discovery_interval,
            discovery_wait=ns.discovery_wait,
            job_metrics_interval=ns.job_metrics_interval,
            jobs_dir=Path(ns.jobs_dir).resolve() if ns.jobs_dir else None,
            jobs_max_file_bytes=ns.jobs_max_file_bytes,
            default_model=ns.default_model,
            metrics=MetricsEndpoint.from_namespace(ns),
            tracing=TracingConfig.from_namespace(ns),
            retention=retention(ns),
            http=HttpLimits.from_namespace(ns),
            search_sink=ns.search_sink,
            job_sinks=comma_list(ns.job_sinks),
            search_model=ns.search_model,
        )


def _check_sink(url: str, flag: str) -> None:
    """A --search-sink (--job-sinks) URL the sinks take (its scheme, parameters and client), before the gateway starts;
    nothing is connected to here (the store may come up later)."""
    from shared.sinks import SinkError, sink_for

    try:
        sink_for(url)
    except SinkError as exc:
        raise ConfigError(f"{flag}: {exc.message}") from None


def api_keys(ns: argparse.Namespace) -> tuple[str, ...]:
    """The keys of --api-keys and --api-keys-file (``embedfleet up`` sends one on its readiness checks)."""
    return _keys(ns.api_keys, ns.api_keys_file, "--api-keys-file")


def operator_keys(ns: argparse.Namespace) -> tuple[str, ...]:
    """The keys of --operator-keys and --operator-keys-file."""
    return _keys(getattr(ns, "operator_keys", ""), getattr(ns, "operator_keys_file", None), "--operator-keys-file")


def _keys(listed: str, file: str | None, flag: str) -> tuple[str, ...]:
    keys = list(comma_list(listed))
    if file:
        path = Path(file)
        try:
            keys += [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
        except OSError as exc:
            raise ConfigError(f"{flag} {path}: {exc.strerror}") from None
        if not keys:
            raise ConfigError(f"{flag} {path} holds no key")
    return tuple(keys)
