"""The embedded nats-server's HTTP monitoring port (no credentials asked there) is off unless asked
for: the server listens on its client port alone, and is still found ready (JetStream on) by the INFO
line of that port; asked for, monitoring listens on 127.0.0.1 only."""

from __future__ import annotations

import json
import urllib.request

import psutil

from embedfleet.shared.nats.server import EmbeddedNats


def _listening(pid: int) -> set[tuple[str, int]]:
    """The (address, port) pairs process ``pid`` listens on."""
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    }


def test_monitoring_is_off_by_default_and_the_server_is_ready_all_the_same(tmp_path):
    with EmbeddedNats(tmp_path / "nats", config='authorization {\n  token: "secret-token"\n}\n') as server:
        assert server.pid is not None and server.monitor_port is None
        assert _listening(server.pid) == {("127.0.0.1", server.port)}
        conf = (tmp_path / "nats" / "nats-server.conf").read_text().splitlines()
        assert not [line for line in conf if line.startswith(("http", "monitor"))], conf
        assert server._healthy()  # ready: JetStream announced on the client port, before any credential


def test_monitoring_asked_for_listens_on_loopback_only(tmp_path):
    with EmbeddedNats(tmp_path / "nats", monitor=True) as server:
        assert server.pid is not None and server.monitor_port is not None
        assert _listening(server.pid) == {("127.0.0.1", server.port), ("127.0.0.1", server.monitor_port)}
        with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/varz", timeout=5) as resp:
            assert json.loads(resp.read())["http_host"] == "127.0.0.1"


def test_a_server_not_started_is_not_ready(tmp_path):
    assert not EmbeddedNats(tmp_path / "nats")._healthy()
