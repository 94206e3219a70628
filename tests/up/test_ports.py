"""`embedfleet up`'s port check: a port another process listens on is named with its holder."""

from __future__ import annotations

import os
import socket

import pytest

from embedfleet.services.up.ports import check_ports, holder, port_taken
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.nats.server import free_port


def test_a_listening_port_is_named_with_this_process():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert holder(port).startswith(f"pid {os.getpid()} (")
        taken = port_taken("127.0.0.1", port)
        assert taken is not None and taken.startswith(f"port {port} on 127.0.0.1 is in use by pid {os.getpid()} (")
        # the wildcard address meets the same socket
        assert port_taken("0.0.0.0", port) is not None
        with pytest.raises(ConfigError, match=rf"^--metrics-port: port {port} on 127.0.0.1 is in use by pid"):
            check_ports("127.0.0.1", free_port(), "127.0.0.1", port)


def test_a_free_port_passes_with_no_holder():
    port = free_port()
    assert port_taken("127.0.0.1", port) is None
    check_ports("127.0.0.1", port, "127.0.0.1", 0)  # --metrics-port 0: none to check
    assert holder(port) == "another process (none this user may see)"


def test_an_address_not_of_this_machine_is_refused_naming_the_flag():
    with pytest.raises(ConfigError, match=r"^--port \d+: cannot listen on 192\.0\.2\.1:\d+ \(.+\)$"):
        port_taken("192.0.2.1", free_port())
