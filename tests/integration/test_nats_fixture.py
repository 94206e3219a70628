"""Both NATS paths of the test suite: the container (where Docker runs) and the binary."""

import asyncio

import nats
import pytest

pytestmark = pytest.mark.integration


async def _round_trip(url: str) -> tuple[bytes, bool]:
    nc = await nats.connect(url)
    try:
        sub = await nc.subscribe("fixture.echo")
        await nc.publish("fixture.echo", b"ping")
        msg = await sub.next_msg(timeout=5)
        js = nc.jetstream()
        info = await js.account_info()  # JetStream is on
        return msg.data, info is not None
    finally:
        await nc.close()


def test_nats_server_fixture(nats_url):
    assert asyncio.run(_round_trip(nats_url)) == (b"ping", True)


def test_nats_container_fixture(nats_container_url):
    assert asyncio.run(_round_trip(nats_container_url)) == (b"ping", True)
