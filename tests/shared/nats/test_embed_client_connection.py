"""The embed client on a real nats-server that goes away: the requests in flight fail at once (503),
not at their deadline, and the callbacks the connection was made with still run."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.nats.config import NatsConfig
from embedfleet.shared.nats.embed_client import EmbedClient
from embedfleet.shared.nats.lifecycle import connect
from embedfleet.shared.nats.server import EmbeddedNats
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import EmbedOptions

pytestmark = pytest.mark.integration

DEADLINE = 30.0  # the requests' own timeout: far beyond the margin the test allows


async def _in_flight_when_the_server_dies(server: EmbeddedNats) -> tuple[list, float, float]:
    """Two requests held by a subscriber that never answers, then the server killed: what each request
    raised, and when (monotonic) the kill was and the last request ended."""
    subjects = Subjects("conntest")
    nc = await connect(NatsConfig(server.url, subjects), "embedfleet-gateway")
    taker = await connect(NatsConfig(server.url, subjects), "embedfleet-tokenizer")
    arrived = asyncio.Event()

    async def take(msg) -> None:  # a tokenizer that never answers
        arrived.set()

    await taker.subscribe(subjects.embed("m"), cb=take)
    await taker.flush()
    client = EmbedClient(nc, subjects)
    await client.start()
    try:
        calls = [asyncio.create_task(client.embed("m", ["a text"], EmbedOptions(), DEADLINE)) for _ in range(2)]
        await asyncio.wait_for(arrived.wait(), DEADLINE / 2)  # seconds on an idle machine; more on a loaded one
        assert client.in_flight == 2
        killed = time.monotonic()
        server.kill()
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        return outcomes, killed, time.monotonic()
    finally:
        await client.stop()
        for conn in (nc, taker):
            await conn.close()


def test_a_dropped_connection_fails_the_requests_in_flight_at_once(tmp_path, caplog):
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    try:
        with caplog.at_level(logging.WARNING, "embedfleet"):
            outcomes, killed, ended = asyncio.run(_in_flight_when_the_server_dies(server))
    finally:
        server.stop()
    for outcome in outcomes:
        assert isinstance(outcome, ServiceError), outcome
        assert outcome.code is ErrorCode.NO_RESPONDERS
        assert outcome.message == "lost the connection to the NATS server; retry shortly"
    assert ended - killed < 2.0, ended - killed  # at once, not at the 30 s deadline
    # the callback embedfleet.shared.nats.lifecycle.connect gave the connection still runs after the client's
    assert "nats: disconnected" in caplog.text
