"""Gateway configuration, built once from CLI flags and EMBEDFLEET_* variables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from shared.config import NatsConfig, add_option, nats_config, positive_float, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--host", "EMBEDFLEET_HOST", "127.0.0.1", "address to listen on")
    add_option(parser, "--port", "EMBEDFLEET_PORT", 8080, "HTTP port", int)
    add_option(parser, "--request-timeout", "EMBEDFLEET_REQUEST_TIMEOUT", 30.0, "seconds a request may take", positive_float)
    add_option(parser, "--max-inputs", "EMBEDFLEET_MAX_INPUTS", 2048, "max inputs in one request", positive_int)
    add_option(parser, "--max-body-bytes", "EMBEDFLEET_MAX_BODY_BYTES", 8 << 20, "max request body size in bytes", positive_int)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    nats: NatsConfig
    host: str
    port: int
    request_timeout: float
    max_inputs: int
    max_body_bytes: int
    discovery_interval: float = 2.0  # seconds between fleet polls
    discovery_wait: float = 0.25  # seconds to gather ping replies

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> GatewayConfig:
        return cls(
            nats=nats_config(ns),
            host=ns.host,
            port=ns.port,
            request_timeout=ns.request_timeout,
            max_inputs=ns.max_inputs,
            max_body_bytes=ns.max_body_bytes,
        )
