"""NATS connection and service lifecycle: connect (retrying until it answers, or until SIGTERM/SIGINT
or a deadline), serve, drain on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

import nats
from nats.aio.client import Client
from nats.micro import add_service
from nats.micro.service import Service, ServiceConfig

from embedfleet.shared import __version__
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.nats.auth import redact
from embedfleet.shared.nats.config import NatsConfig
from embedfleet.shared.nats.subjects import SERVICE_NAMES, Subjects, inbox_prefix

log = logging.getLogger("embedfleet")

# after SIGTERM: seconds a service has to finish its in-flight work, then to drain its NATS connection
# (deploy/k8s's terminationGracePeriodSeconds outlast the two together)
STOP_TIMEOUT = 30.0
DRAIN_TIMEOUT = 10.0
SERVER_GONE = 1.0  # seconds without the NATS server, while stopping, before stopping without it


class Runnable(Protocol):
    async def start(self) -> None:
        """Subscribe and start taking work."""

    async def stop(self) -> None:
        """Stop taking work and finish what is in flight."""


async def cancel(task: asyncio.Task | None) -> None:
    """Cancel a background task and wait until it has stopped."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


class ConnectAborted(Exception):
    """The service was told to stop before NATS accepted its connection."""


class RepeatFilter:
    """Logs a warning, and the same warning again only after ``every`` seconds, with how often it
    came meanwhile: a refused connection is retried twice a second, forever."""

    def __init__(self, every: float = 30.0) -> None:
        self._every = every
        self._seen: dict[str, tuple[float, int]] = {}  # message -> (last logged, repeats since)

    def warning(self, message: str) -> None:
        now = time.monotonic()
        last, repeats = self._seen.get(message, (-math.inf, 0))  # never logged: -inf, long ago
        if now - last < self._every:
            self._seen[message] = (last, repeats + 1)
            return
        self._seen[message] = (now, 0)
        log.warning("%s%s", message, f" ({repeats} more times in {now - last:.0f}s)" if repeats else "")


def describe_error(exc: BaseException, cfg: NatsConfig) -> str:
    """A NATS client error, saying what to check when it is about credentials or TLS; never a secret."""
    text = redact(str(exc) or type(exc).__name__).removeprefix("nats: ")
    lowered = text.lower()
    if isinstance(exc, nats.errors.AuthorizationError) or "authorization" in lowered or "authentication" in lowered:
        return (
            f"the server refused the credentials ({text}); this service gives {cfg.auth.method}: check "
            "--nats-user/--nats-password-file, --nats-token-file, --nats-nkey-seed or --nats-creds"
        )
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed ({text}): check --nats-tls-ca, --nats-tls-cert/--nats-tls-key and --nats-tls-hostname"
    return text


async def unless_stopped(work: Awaitable[Any], stop: asyncio.Event | None) -> Any:
    """``await work``, given up (ConnectAborted) as soon as ``stop`` is set."""
    if stop is None:
        return await work
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled from outside: take both along
        task.cancel()
        raise
    finally:
        stopping.cancel()
    if task.done():
        return task.result()
    await _cancelled(task)
    raise ConnectAborted


async def _cancelled(task: asyncio.Task) -> None:
    """Cancel ``task`` until it has stopped. One cancel can be lost: nats-py retries a refused
    connection in a loop that catches every Exception, around ``asyncio.wait_for`` (its TCP connect),
    and Python 3.11's wait_for, cancelled just as the attempt it waits for failed, raises that
    failure instead of the cancel; the loop then goes on trying, and awaiting the task would wait
    forever. The next cancel lands in its half-second pause between attempts."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.result()


async def connect(cfg: NatsConfig, name: str, stop: asyncio.Event | None = None) -> Client:
    """Connect to NATS with the configured credentials and TLS, retrying until it answers (or
    ``stop`` is set: ConnectAborted); once connected, reconnect forever."""
    warnings = RepeatFilter()
    last = "no answer yet"  # the last failure, told when the caller stops waiting

    async def on_error(exc: Exception) -> None:
        nonlocal last
        last = describe_error(exc, cfg)
        warnings.warning(f"nats: {last}")

    async def on_disconnect() -> None:
        if not (nc.is_draining or nc.is_closed):
            log.warning("nats: disconnected")

    async def on_reconnect() -> None:
        url = nc.connected_url
        log.info("nats: reconnected to %s", f"{url.hostname}:{url.port}" if url else "?")

    options = {**cfg.auth.connect_options(), **cfg.tls.connect_options()}
    delay = 0.1
    while True:
        nc = Client()
        try:
            # The first connection is tried without nats-py's own retries: after a failed TLS
            # handshake they wait forever on the dead socket (nats.py issue #718). This loop tries
            # again with a fresh client instead; refused TCP connections nats-py retries itself.
            await unless_stopped(
                nc.connect(
                    servers=cfg.url.split(","),
                    name=name,
                    inbox_prefix=inbox_prefix(
                        name
                    ),  # replies only to this role's inboxes (embedfleet.shared.permissions)
                    # seconds: nats-py annotates them int, and passes them on to asyncio, which takes floats
                    connect_timeout=cfg.connect_timeout,  # type: ignore[arg-type]
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,  # type: ignore[arg-type]
                    allow_reconnect=False,
                    error_cb=on_error,
                    disconnected_cb=on_disconnect,
                    reconnected_cb=on_reconnect,
                    **options,
                ),
                stop,
            )
            nc.options["allow_reconnect"] = True  # connected: from now on nats-py reconnects, forever
            return nc
        except ConnectAborted:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 1)
            raise ConnectAborted(last) from None
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            # on_error has logged it; the failed client's socket is closed by the server or the
            # failed handshake, and closing the client could wait forever on it (see above)
            last = describe_error(exc, cfg)
            if stop is not None and stop.is_set():
                raise ConnectAborted(last) from exc
            log.debug("nats: cannot connect to %s (%s); retrying in %.1fs", cfg.url, describe_error(exc, cfg), delay)
            try:
                await unless_stopped(asyncio.sleep(delay), stop)
            except ConnectAborted:
                raise ConnectAborted(last) from exc
            delay = min(delay * 2, 5.0)


class NatsUnreachable(ConfigError):
    """NATS did not accept a one-shot command's connection in time."""


# seconds a one-shot command (reindex, jobs, init) waits for NATS: a server that runs answers in
# milliseconds, and a refused or unanswered connection must end the command, not hold it forever
ONE_SHOT_PATIENCE = 5.0


async def connect_within(cfg: NatsConfig, name: str, seconds: float = ONE_SHOT_PATIENCE) -> Client:
    """Connect as ``connect`` does, giving up after ``seconds`` with NatsUnreachable naming the URL."""
    stop = asyncio.Event()
    timer = asyncio.get_running_loop().call_later(seconds, stop.set)
    try:
        return await connect(cfg, name, stop)
    except ConnectAborted as exc:
        raise NatsUnreachable(f"cannot reach NATS at {cfg.url} within {seconds:.0f}s: {exc}") from None
    finally:
        timer.cancel()


def stopped_by_signal(also: asyncio.Event | None = None) -> asyncio.Event:
    """An event SIGTERM or SIGINT sets (and ``also``), on the running loop (for as long as it runs)."""
    stop = asyncio.Event()

    def stopping() -> None:
        stop.set()
        if also is not None:
            also.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping)
    return stop


def wait_for_nats(cfg: NatsConfig, role: str, seconds: float | None = None) -> bool:
    """Before a service starts: connect once and let go. True once NATS answered; False when SIGTERM or
    SIGINT came first; NatsUnreachable when ``seconds`` (None: no limit) passed without an answer.
    (The gateway connects in uvicorn's start-up, which no signal interrupts: it waits here first.)"""

    async def reach() -> bool:
        stop = asyncio.Event()  # a signal, or the time given is up
        signalled = stopped_by_signal(also=stop)
        timer = None if seconds is None else asyncio.get_running_loop().call_later(seconds, stop.set)
        try:
            nc = await connect(cfg, f"embedfleet-{role}", stop)
        except ConnectAborted as exc:
            if signalled.is_set():
                return False
            raise NatsUnreachable(f"cannot reach NATS at {cfg.url} within {seconds:.0f}s: {exc}") from None
        finally:
            if timer is not None:
                timer.cancel()
        await nc.close()
        return True

    return run_async(reach())


async def register(nc: Client, subjects: Subjects, role: str, description: str, metadata: dict[str, str]) -> Service:
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


async def drain_or_close(nc: Client) -> None:
    """Drain the connection (what was received is handled, what was published is sent); where that
    fails (the server is gone: the client is reconnecting), close it: a reconnecting client's task
    would otherwise keep the event loop, and the process, from ending."""
    try:
        await asyncio.wait_for(nc.drain(), timeout=DRAIN_TIMEOUT)
    except Exception as exc:
        log.warning("nats drain: %s", exc)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), timeout=DRAIN_TIMEOUT)


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
        stop = stopped_by_signal()
        try:
            nc = await connect(cfg, f"embedfleet-{role}", stop)
        except ConnectAborted:
            log.info("%s stopped before NATS accepted it", role)
            return
        service = build(nc)
        await service.start()
        log.info("%s ready (nats %s, %s)", role, cfg.url, cfg.auth.method)
        mark_ready(cfg, True)
        await stop.wait()
        mark_ready(cfg, False)
        log.info("%s stopping: finishing in-flight work", role)
        await _stop_service(role, service, nc)
        if not nc.is_closed:
            await drain_or_close(nc)
        log.info("%s stopped", role)

    run_async(main())


async def _stop_service(role: str, service: Runnable, nc: Client) -> None:
    """``service.stop()``, for at most STOP_TIMEOUT seconds. Where the NATS server goes away meanwhile
    for over SERVER_GONE seconds (it stops with `up`, killed or not), nothing in flight can be answered:
    the connection is closed, so that the stop's own NATS calls fail at once instead of waiting for a
    server that is not coming back."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.ensure_future(service.stop())
    deadline, away_since = loop.time() + STOP_TIMEOUT, None
    while not stopping.done():
        await asyncio.wait({stopping}, timeout=0.2)
        now = loop.time()
        if stopping.done():
            break
        if nc.is_connected or nc.is_closed:
            away_since = None
        elif away_since is None:
            away_since = now
        elif now - away_since > SERVER_GONE:
            log.info("%s: its NATS server is gone: stopping without it", role)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), timeout=2.0)
        if now > deadline:
            log.warning("%s: in-flight work did not finish within %.0fs", role, STOP_TIMEOUT)
            stopping.cancel()
            break
    try:
        await stopping
    except asyncio.CancelledError:
        pass
    except Exception as exc:  # a NATS call of a stop whose connection was closed
        log.info("%s: stopping: %r", role, exc)


def run_async(main: Coroutine[Any, Any, Any]) -> Any:
    """Run ``main`` to completion on uvloop where it is installed (C socket I/O: a small request's
    cost is mostly event-loop work), else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        factory = None
    else:
        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


# tries at a JetStream set-up that times out: a cluster just started may still be electing its
# JetStream leader (seconds); a server without JetStream answers at once, and is not tried again
JETSTREAM_TRIES = 4


async def start_jetstream_part(start: Callable[[], Awaitable[Any]]) -> None:
    """``await start()``, tried again while it times out (up to JETSTREAM_TRIES times)."""
    for attempt in range(1, JETSTREAM_TRIES + 1):
        try:
            await start()
            return
        except TimeoutError:
            if attempt == JETSTREAM_TRIES:
                raise
            log.info("JetStream did not answer in time (try %d of %d); trying again", attempt, JETSTREAM_TRIES)
