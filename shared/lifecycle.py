"""NATS connection and service lifecycle: connect (retrying forever), serve, drain on SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import Callable, Protocol

import nats
from nats.aio.client import Client
from nats.micro import add_service
from nats.micro.service import Service, ServiceConfig

from shared import __version__
from shared.config import NatsConfig
from shared.subjects import SERVICE_NAMES, Subjects

log = logging.getLogger("embedfleet")


class Runnable(Protocol):
    async def start(self) -> None:
        """Subscribe and start taking work."""

    async def stop(self) -> None:
        """Stop taking work and finish what is in flight."""


def setup_logging(level: str, role: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s %(levelname)s {role} %(name)s: %(message)s",
    )


async def connect(cfg: NatsConfig, name: str, stop: asyncio.Event | None = None) -> Client:
    """Connect to NATS, retrying until it answers; once connected, reconnect forever."""

    async def on_error(exc: Exception) -> None:
        log.warning("nats: %s", exc)

    async def on_disconnect() -> None:
        if not (nc.is_draining or nc.is_closed):
            log.warning("nats: disconnected")

    async def on_reconnect() -> None:
        log.info("nats: reconnected to %s", nc.connected_url.netloc if nc.connected_url else "?")

    delay = 0.1
    while True:
        nc = Client()
        try:
            await nc.connect(
                servers=cfg.url.split(","),
                name=name,
                connect_timeout=cfg.connect_timeout,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                allow_reconnect=True,
                error_cb=on_error,
                disconnected_cb=on_disconnect,
                reconnected_cb=on_reconnect,
            )
            return nc
        except (OSError, nats.errors.Error, asyncio.TimeoutError) as exc:
            if stop is not None and stop.is_set():
                raise
            log.warning("nats: cannot connect to %s (%s); retrying in %.1fs", cfg.url, exc or type(exc).__name__, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def register(
    nc: Client, subjects: Subjects, role: str, description: str, metadata: dict[str, str]
) -> Service:
    """Register as a NATS micro service: $SRV.PING/INFO/STATS answer for this process.

    The metadata carries the subject prefix: fleets under different prefixes share a NATS server
    without seeing each other.
    """
    return await add_service(
        nc,
        ServiceConfig(
            name=SERVICE_NAMES[role],
            version=__version__,
            description=description,
            metadata={"prefix": subjects.prefix, **metadata},
        ),
    )


def mark_ready(cfg: NatsConfig, ready: bool) -> None:
    """Write (or remove) the ready file that readiness probes look for."""
    if not cfg.ready_file:
        return
    path = Path(cfg.ready_file)
    if ready:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{os.getpid()}\n")
    else:
        path.unlink(missing_ok=True)


def run_service(
    role: str,
    cfg: NatsConfig,
    build: Callable[[Client], Runnable],
) -> None:
    """Run one service until SIGTERM/SIGINT, then stop it (finishing in-flight work) and drain NATS."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        nc = await connect(cfg, f"embedfleet-{role}", stop)
        service = build(nc)
        await service.start()
        log.info("%s ready (nats %s)", role, cfg.url)
        mark_ready(cfg, True)
        await stop.wait()
        mark_ready(cfg, False)
        log.info("%s stopping: finishing in-flight work", role)
        try:
            await asyncio.wait_for(service.stop(), timeout=30)
        except asyncio.TimeoutError:
            log.warning("%s: in-flight work did not finish within 30s", role)
        try:
            await asyncio.wait_for(nc.drain(), timeout=10)
        except Exception as exc:  # a drain during reconnect can fail; we exit either way
            log.warning("nats drain: %s", exc)
        log.info("%s stopped", role)

    asyncio.run(main())
