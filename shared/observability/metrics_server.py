"""Prometheus exposition of one service's own registry on a port of its own (``--metrics-port``).

prometheus_client's HTTP server answers on a daemon thread: a scrape never waits for the service's
event loop, and only reads values the loop updates (each metric under its own lock). Any path
answers the metrics; ``/metrics`` is the one to scrape. Port 0 (the default) serves none: several
processes on one machine would collide on any fixed port, so `embedfleet up` gives each a free one.
"""

from __future__ import annotations

import argparse
import logging
import socket
from dataclasses import dataclass
from threading import Thread

from prometheus_client import CollectorRegistry, start_http_server

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.config.registry import from_options, setting

log = logging.getLogger("embedfleet.metrics")


@dataclass(frozen=True, slots=True)
class MetricsEndpoint:
    """Where a service serves its metrics; port 0: nowhere."""

    port: int = setting("metrics_port")
    host: str = setting("metrics_host")

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--metrics-port {self.port}: must be 0 (none) or a port number up to 65535")

    @property
    def enabled(self) -> bool:
        return self.port != 0

    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else "[::1]" if self.host == "::" else self.host
        return f"http://{host}:{self.port}/metrics"

    def check(self) -> None:
        """Fail now, naming the option, when the port cannot be had: the service binds it only once
        connected to NATS (a worker: once its model is loaded)."""
        if not self.enabled:
            return
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the exposition's server does
                s.bind((self.host, self.port))
        except OSError as exc:
            raise ConfigError(
                f"--metrics-port {self.port}: cannot listen on {self.host}:{self.port} ({exc.strerror or exc})"
            ) from None

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> MetricsEndpoint:
        endpoint = from_options(cls, ns)
        endpoint.check()
        return endpoint


class MetricsServer:
    """A running exposition; ``close()`` stops it and may be called more than once."""

    def __init__(self, server, thread: Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def close(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._server = None


def serve_metrics(registry: CollectorRegistry, endpoint: MetricsEndpoint) -> MetricsServer | None:
    """Serve ``registry`` on ``endpoint`` (None when its port is 0); a port that cannot be had stops the
    service with a message naming the option."""
    if not endpoint.enabled:
        return None
    try:
        server, thread = start_http_server(endpoint.port, endpoint.host, registry=registry)
    except OSError as exc:
        raise ConfigError(
            f"--metrics-port {endpoint.port}: cannot listen on {endpoint.host}:{endpoint.port} ({exc.strerror or exc})"
        ) from None
    log.info("metrics on %s", endpoint.url())
    return MetricsServer(server, thread)
