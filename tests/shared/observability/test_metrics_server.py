"""--metrics-port: the option, and a service's registry served on a port of its own."""

from __future__ import annotations

import socket

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter

from embedfleet.services.cli.main import build_parser
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.nats.server import free_port
from embedfleet.shared.observability.metrics_server import MetricsEndpoint, serve_metrics
from tests.support.prometheus_text import value


def _registry() -> tuple[CollectorRegistry, Counter]:
    registry = CollectorRegistry()
    return registry, Counter("things", "things done", registry=registry)


def test_serves_its_registry_and_stops():
    registry, things = _registry()
    things.inc(3)
    port = free_port()
    server = serve_metrics(registry, MetricsEndpoint(port, "127.0.0.1"))
    try:
        assert server.port == port
        r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert value(r.text, "things_total") == 3.0
        things.inc()
        assert value(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text, "things_total") == 4.0
    finally:
        server.close()
        server.close()  # a second close is harmless
    with pytest.raises(httpx.ConnectError):  # nothing listens there any more
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)


def test_port_zero_serves_nothing():
    registry, _ = _registry()
    assert serve_metrics(registry, MetricsEndpoint()) is None
    assert not MetricsEndpoint().enabled


def test_a_taken_port_names_the_option():
    registry, _ = _registry()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}"):
            serve_metrics(registry, MetricsEndpoint(port, "127.0.0.1"))


def test_endpoint_checks_and_url():
    with pytest.raises(ConfigError, match="--metrics-port 70000"):
        MetricsEndpoint(70000)
    assert MetricsEndpoint(9100, "0.0.0.0").url() == "http://127.0.0.1:9100/metrics"
    assert MetricsEndpoint(9100, "10.1.2.3").url() == "http://10.1.2.3:9100/metrics"


@pytest.mark.parametrize("command", ["gateway", "tokenizer", "worker", "scorer", "up"])
def test_every_service_takes_the_option_and_its_variable(command, monkeypatch):
    monkeypatch.delenv("EMBEDFLEET_METRICS_PORT", raising=False)
    monkeypatch.delenv("EMBEDFLEET_METRICS_HOST", raising=False)
    ns = build_parser().parse_args([command])
    assert (ns.metrics_port, ns.metrics_host) == (0, "127.0.0.1")  # off unless asked for
    monkeypatch.setenv("EMBEDFLEET_METRICS_PORT", "9123")
    monkeypatch.setenv("EMBEDFLEET_METRICS_HOST", "0.0.0.0")
    ns = build_parser().parse_args([command])
    assert (ns.metrics_port, ns.metrics_host) == (9123, "0.0.0.0")
    assert build_parser().parse_args([command, "--metrics-port", "9200"]).metrics_port == 9200  # the flag wins


def test_an_out_of_range_port_is_refused():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--metrics-port", "65536"])


def test_a_taken_port_stops_the_command_before_it_connects():
    """Checked when the options are read: a service binds its port only once connected to NATS."""
    import argparse
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--metrics-port {port}"):
            MetricsEndpoint.from_namespace(argparse.Namespace(metrics_port=port, metrics_host="127.0.0.1"))
        # no NATS listens on port 1: the command must stop on the option, not wait for NATS
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "embedfleet.services.cli",
                "scorer",
                "--metrics-port",
                str(port),
                "--nats",
                "nats://127.0.0.1:1",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert f"--metrics-port {port}: cannot listen" in result.stderr and "Traceback" not in result.stderr
    free = MetricsEndpoint.from_namespace(argparse.Namespace(metrics_port=free_port(), metrics_host="127.0.0.1"))
    assert free.enabled
