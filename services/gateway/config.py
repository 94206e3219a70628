"""Gateway configuration, built once from CLI flags and EMBEDFLEET_* variables."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.config.registry import from_options, option, setting
from embedfleet.shared.jobs.settings import Retention, retention
from embedfleet.shared.nats.config import NatsConfig, nats_config
from embedfleet.shared.observability.metrics_server import MetricsEndpoint
from embedfleet.shared.observability.tracing import TracingConfig


def comma_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What a client may send before the application sees its request (services/gateway/http/server.py)."""

    max_header_bytes: int = setting("max_header_bytes")  # request target and header fields; more: 431
    max_headers: int = setting("max_headers")  # header fields; more: 431
    header_timeout: float = setting("header_timeout")  # seconds to send the request line and headers; more: 408
    body_timeout: float = setting("body_timeout")  # seconds to send the body once the headers are in; more: 408

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> HttpLimits:
        return from_options(cls, ns)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    nats: NatsConfig
    host: str = setting("host")
    port: int = setting("port")
    request_timeout: float = setting("request_timeout")
    max_inputs: int = setting("max_inputs")
    max_body_bytes: int = setting("max_body_bytes")
    max_input_chars: int = setting("max_input_chars")
    max_document_chars: int = setting("max_document_chars")  # a bulk job's document
    max_image_bytes: int = setting("max_image_bytes")  # one image file (shared/images/decode.py's ImageLimits)
    max_image_pixels: int = setting("max_image_pixels")  # one image's declared width x height
    # hosts image URLs are fetched from (services/gateway/image_fetch.py; none: no URL is), and those of them
    # that may resolve to private addresses
    image_hosts: tuple[str, ...] = setting("image_hosts", convert=comma_list)
    image_hosts_private: tuple[str, ...] = setting("image_hosts_private", convert=comma_list)
    job_max_result_bytes: int = setting("job_max_result_bytes")  # 0: no limit
    max_in_flight: int = setting("max_in_flight")
    # none: no auth (operator keys are among them; from_namespace adds --api-keys-file's)
    api_keys: tuple[str, ...] = setting("api_keys", convert=comma_list)
    operator_keys: tuple[str, ...] = setting("operator_keys", convert=comma_list)  # keys that see every bulk job
    # --key-tables-file: (key, the tables and prefixes it may use) a key (services/gateway/tenants.py)
    key_tables: tuple[tuple[str, tuple[str, ...]], ...] = ()
    key_requests_per_minute: int = setting("key_requests_per_minute")  # per API key; 0: no limit
    key_tokens_per_minute: int = setting("key_tokens_per_minute")
    open_paths: tuple[str, ...] = setting("open_paths", convert=comma_list)  # served without an API key
    # names the gateway is served as (none: browser.default_hosts) and web origins that may call it (none: no page)
    allowed_hosts: tuple[str, ...] = setting("allowed_hosts", convert=comma_list)
    allowed_origins: tuple[str, ...] = setting("allowed_origins", convert=comma_list)
    key_id_secret: str | None = None  # $EMBEDFLEET_KEY_ID_SECRET (services/gateway/metrics.py); None: random
    jobs_dir: Path | None = setting("jobs_dir", convert=lambda given: Path(given).resolve() if given else None)
    jobs_max_file_bytes: int = setting("jobs_max_file_bytes")
    discovery_interval: float = setting("discovery_interval")  # seconds between fleet polls; 3 silent: dead
    retries: int = setting("retries")  # attempts after the first for rows a dead process may have held
    discovery_wait: float = setting("discovery_wait")  # seconds to gather ping replies
    default_model: str | None = setting("default_model")  # None: the first model served, by id
    job_metrics_interval: float = setting("job_metrics_interval")  # seconds between reads of the jobs' progress
    metrics: MetricsEndpoint = MetricsEndpoint()  # besides /metrics on the HTTP port
    tracing: TracingConfig = TracingConfig()  # spans over OTLP (--otlp-endpoint), else only passed on
    retention: Retention = Retention()  # set on the results stream and job bucket the gateway meets
    http: HttpLimits = HttpLimits()  # header size and count, slow clients
    search_sink: str | None = setting(
        "search_sink"
    )  # the vector store POST /v1/search reads (shared/sinks); None: not served
    search_model: str | None = setting(
        "search_model"
    )  # the model whose vectors it holds; None: the request's, else the default
    # the stores POST /v1/jobs may write into ("sink"); none: jobs write into none
    job_sinks: tuple[str, ...] = setting("job_sinks", convert=comma_list)

    def __post_init__(self) -> None:
        if self.default_model is not None and not self.default_model.strip():
            raise ConfigError("--default-model must name a model")
        if self.search_model is not None and self.search_sink is None:
            raise ConfigError("--search-model names the model of the --search-sink store's vectors: give --search-sink")
        check_sinks(self.search_sink, self.job_sinks)
        from embedfleet.services.gateway.http.browser import rules_of

        rules_of(self.allowed_hosts, self.allowed_origins, self.host)  # a bad --allowed-origins: said now
        from embedfleet.services.gateway.image_fetch import ImageHosts

        ImageHosts.of(self.image_hosts, self.image_hosts_private)  # a bad --image-hosts entry: said now
        if (self.key_requests_per_minute or self.key_tokens_per_minute) and not self.api_keys:
            raise ConfigError(
                "--key-requests-per-minute and --key-tokens-per-minute limit each API key: give the keys "
                "(--api-keys or --api-keys-file)"
            )

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> GatewayConfig:
        keys = tuple(dict.fromkeys(api_keys(ns) + operator_keys(ns)))
        return from_options(
            cls,
            ns,
            nats=nats_config(ns),
            api_keys=keys,
            key_id_secret=option("key_id_secret").from_env(os.environ),
            key_tables=key_tables(ns, keys),
            operator_keys=operator_keys(ns),
            metrics=MetricsEndpoint.from_namespace(ns),
            tracing=TracingConfig.from_namespace(ns),
            retention=retention(ns),
            http=HttpLimits.from_namespace(ns),
        )


def check_sinks(search_sink: str | None, job_sinks: tuple[str, ...]) -> None:
    """The --search-sink and --job-sinks URLs, each one the sinks take (its scheme and parameters) with
    its store's client installed here, before the gateway starts (``embedfleet up``: before anything
    starts); nothing is connected to (the store may come up later)."""
    from embedfleet.shared.sinks import checked_sink

    if search_sink is not None:
        checked_sink(search_sink, "--search-sink")
    for url in job_sinks:
        checked_sink(url, "--job-sinks")


def api_keys(ns: argparse.Namespace) -> tuple[str, ...]:
    """The keys of --api-keys and --api-keys-file (``embedfleet up`` sends one on its readiness checks)."""
    return _keys(ns.api_keys, ns.api_keys_file, "--api-keys-file")


def operator_keys(ns: argparse.Namespace) -> tuple[str, ...]:
    """The keys of --operator-keys and --operator-keys-file."""
    return _keys(getattr(ns, "operator_keys", ""), getattr(ns, "operator_keys_file", None), "--operator-keys-file")


def key_tables(ns: argparse.Namespace, keys: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The tables --key-tables-file gives each of ``keys`` (services/gateway/tenants.py)."""
    from embedfleet.services.gateway.key_tables import read_key_tables

    file = getattr(ns, "key_tables_file", None)
    if not file:
        return ()
    if not keys:
        raise ConfigError("--key-tables-file names the tables of each API key: give the keys (--api-keys)")
    return tuple(read_key_tables(Path(file), keys).items())


def _keys(listed: str, file: str | None, flag: str) -> tuple[str, ...]:
    keys = list(comma_list(listed))
    if file:
        path = Path(file)
        try:
            keys += [
                line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")
            ]
        except OSError as exc:
            raise ConfigError(f"{flag} {path}: {exc.strerror}") from None
        if not keys:
            raise ConfigError(f"{flag} {path} holds no key")
    return tuple(keys)
