"""The gateway's HTTP protocol writes a response's head and its first body bytes in one write.

The protocol runs as uvicorn runs it, on a transport that records what is written to the socket."""

import asyncio

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from embedfleet.services.gateway.config import HttpLimits
from embedfleet.services.gateway.http.disconnects import DEPARTURE
from embedfleet.services.gateway.http.server import protocol


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _connected(app):
    """The gateway's protocol for ``app``, as uvicorn makes it, on a new connection."""
    config = Config(app=app, http="httptools", lifespan="off", log_level="warning")
    config.load()
    proto = protocol(HttpLimits())(config=config, server_state=ServerState(), app_state={})
    transport = RecordingTransport()
    proto.connection_made(transport)
    return proto, transport


async def _serve(app, request: bytes) -> RecordingTransport:
    proto, transport = _connected(app)
    proto.data_received(request)
    for _ in range(50):  # the application's task runs on this loop
        await asyncio.sleep(0)
    proto.connection_lost(None)
    return transport


def _app(*bodies: bytes, fail_after_start: bool = False):
    async def app(scope, receive, send):
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/plain")]
                + ([] if len(bodies) != 1 else [(b"content-length", str(len(bodies[0])).encode())]),
            }
        )
        if fail_after_start:
            raise RuntimeError("the application failed after its response started")
        for i, body in enumerate(bodies):
            await send({"type": "http.response.body", "body": body, "more_body": i < len(bodies) - 1})

    return app


def test_a_response_goes_out_in_one_write():
    transport = asyncio.run(_serve(_app(b'{"ok":1}'), b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"))
    assert len(transport.writes) == 1
    head, _, body = transport.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 8" in head and body == b'{"ok":1}'


def test_a_streamed_response_s_head_goes_with_its_first_chunk_and_the_rest_follow():
    transport = asyncio.run(_serve(_app(b"one", b"two", b""), b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"))
    assert len(transport.writes) == 3
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and transport.writes[0].endswith(
        b"\r\n\r\n3\r\none\r\n"
    )
    assert transport.writes[1:] == [b"3\r\ntwo\r\n", b"0\r\n\r\n"]


def test_100_continue_is_written_at_once_and_the_response_after_it():
    async def app(scope, receive, send):
        message = await receive()  # asking for the body sends 100 Continue first
        await _app(message["body"])(scope, receive, send)

    request = b"POST / HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n"

    async def serve() -> RecordingTransport:
        proto, transport = _connected(app)
        proto.data_received(request)
        for _ in range(20):
            await asyncio.sleep(0)
        assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]  # before the body is sent
        proto.data_received(b"hi")
        for _ in range(50):
            await asyncio.sleep(0)
        proto.connection_lost(None)
        return transport

    transport = asyncio.run(serve())
    assert len(transport.writes) == 2 and transport.writes[1].endswith(b"\r\n\r\nhi")


@pytest.mark.parametrize("close", [True, False])
def test_a_head_without_body_is_written_before_the_connection_closes(close):
    """An application that fails after starting its response: uvicorn closes the connection; the
    head held for the body is written first, as uvicorn alone would have written it."""
    transport = asyncio.run(
        _serve(
            _app(b"x", fail_after_start=True),
            b"GET / HTTP/1.1\r\nhost: x\r\n" + (b"connection: close\r\n" if close else b"") + b"\r\n",
        )
    )
    assert transport.closed
    assert len(transport.writes) == 1 and transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")


class FlowTransport(RecordingTransport):
    """A transport that says whether reading is paused."""

    def __init__(self) -> None:
        super().__init__()
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def test_reading_goes_on_once_a_large_body_is_in_so_a_client_leaving_is_seen():
    async def main() -> tuple[bool, bool]:
        body = b"x" * 300_000
        got = asyncio.Event()

        async def app(scope, receive, send):
            while (await receive()).get("more_body"):
                pass
            got.set()
            await asyncio.Event().wait()  # the answer takes its time

        config = Config(app=app, http="httptools", lifespan="off", log_level="warning")
        config.load()
        proto = protocol(HttpLimits())(config=config, server_state=ServerState(), app_state={})
        transport = FlowTransport()
        proto.connection_made(transport)
        head = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body)
        proto.data_received(head + body[:1000])
        for _ in range(10):
            await asyncio.sleep(0)
        proto.data_received(body[1000:])  # past 64 KB in one read: uvicorn pauses reading
        await asyncio.wait_for(got.wait(), 5)
        paused = transport.paused
        departed = asyncio.Event()
        proto.cycle.scope["extensions"][DEPARTURE].on_leave(departed.set)
        proto.connection_lost(None)
        return paused, departed.is_set()

    paused, departed = asyncio.run(main())
    assert not paused
    assert departed
