import socket

from embedfleet.shared.nats import server as nats_server
from embedfleet.shared.nats.server import HOST, free_port


def test_a_free_port_is_below_the_ephemeral_range_and_a_server_can_listen_on_it():
    low = nats_server._ephemeral_low()
    ports = {free_port() for _ in range(20)}
    assert all(nats_server._LISTEN_PORTS_LOW <= p < low for p in ports), (sorted(ports), low)
    assert len(ports) > 1  # drawn at random: two servers started side by side rarely get the same
    with socket.socket() as server:
        server.bind((HOST, ports.pop()))
        server.listen()


def test_a_port_something_listens_on_is_not_handed_out(monkeypatch):
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        busy = taken.getsockname()[1]
        assert not nats_server._bindable(busy)
        monkeypatch.setattr(nats_server, "_LISTEN_PORTS_LOW", busy)
        monkeypatch.setattr(nats_server, "_ephemeral_low", lambda: busy + 1000)
        assert all(free_port() != busy for _ in range(50))


def test_with_no_room_below_the_ephemeral_range_the_kernel_picks(monkeypatch):
    monkeypatch.setattr(nats_server, "_ephemeral_low", lambda: nats_server._LISTEN_PORTS_LOW + 10)
    port = free_port()
    with socket.socket() as server:
        server.bind((HOST, port))
