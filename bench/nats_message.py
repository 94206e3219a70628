"""What one NATS message costs nats-py: a publisher and a subscriber in this process over a real
nats-server, the process's CPU per message (publish, the server's delivery read back, the parser, the
message object, the callback) — the part of a hop no coalescing inside a message can remove.

    python -m bench.nats_message [--messages 20000] [--size 300]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

import nats

from embedfleet.shared.nats.server import EmbeddedNats

# publishes per event-loop pass, as requests arriving together publish
_PER_PASS = 8


async def measure(url: str, messages: int, size: int) -> dict:
    sender, receiver = await nats.connect(url), await nats.connect(url)
    received = 0
    done = asyncio.Event()

    async def take(msg) -> None:
        nonlocal received
        received += 1
        if received == messages:
            done.set()

    await receiver.subscribe("bench.nats-message", cb=take)
    await receiver.flush()
    payload = os.urandom(size)
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(messages):
        await sender.publish("bench.nats-message", payload)
        if i % _PER_PASS == _PER_PASS - 1:
            await asyncio.sleep(0)
    await asyncio.wait_for(done.wait(), 120)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await sender.close()
    await receiver.close()
    return {
        "messages": messages,
        "size": size,
        "cpu_us_per_message": cpu / messages * 1e6,
        "messages_per_s": messages / wall,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--size", type=int, default=300, help="payload bytes")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-nats-message-") as tmp:
        server = EmbeddedNats(Path(tmp))
        server.start()
        try:
            result = asyncio.run(measure(server.url, args.messages, args.size))
        finally:
            server.stop()
    print(
        f"{result['cpu_us_per_message']:.1f} us of CPU a message in nats-py, both ends "
        f"({result['messages']} messages of {result['size']} bytes, {result['messages_per_s']:,.0f} a second)"
    )


if __name__ == "__main__":
    main()
