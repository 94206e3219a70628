"""How many copies of each JetStream stream the servers keep: ``Placement`` settles it stream by
stream, from the option (``--stream-replicas``; unset: automatic) and what the cluster can place.

An automatic count is ``AUTO_REPLICAS`` on a clustered server (one node lost, a majority keeps every
stream) and 1 on a lone one; an existing stream is raised to it, never lowered (an operator may have
set more). A count the cluster cannot place falls back to one copy when automatic, said in the log,
and is a ConfigError when asked for.
"""

from __future__ import annotations

import logging

from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from nats.js.errors import APIError, BadRequestError, NotFoundError

from embedfleet.shared.config.option import ConfigError

log = logging.getLogger("embedfleet.jobs")

AUTO_REPLICAS = 3  # a majority survives one node's loss
# JetStream's answers that a stream's copies cannot be placed: no suitable peers, not enough
# resources, a server that is not clustered
_PLACEMENT_ERRORS = {10005, 10023, 10074}
STREAM_EXISTS = 10058  # a stream of that name is there with another config (made meanwhile by another process)


def clustered(js: JetStreamContext) -> bool:
    """Whether the server this client is connected to is one node of a cluster (its INFO names one)."""
    info = getattr(js._nc, "_server_info", None) or {}  # nats-py keeps the server's INFO here
    return bool(info.get("cluster"))


class Placement:
    """The replicas streams get, settled stream by stream: ``wanted`` (an option; None: automatic) and
    what the server accepts. Automatic replicas that the cluster cannot place fall back to one copy,
    said once in the log; wanted ones that it cannot place are a ConfigError."""

    def __init__(self, js: JetStreamContext, wanted: int | None) -> None:
        self._js = js
        self.wanted = wanted
        self.replicas = wanted or (AUTO_REPLICAS if clustered(js) else 1)

    def target(self, current: int | None) -> int:
        """The copies a stream having ``current`` (None: a new one) should have."""
        if current is None or self.wanted is not None:
            return self.replicas
        return max(self.replicas, current)  # automatic: never lowered

    async def put(self, config: StreamConfig, current: StreamConfig | None) -> None:
        """Create the stream ``config`` describes, or update it (``current``: its config as read), with
        the replicas it should have.

        An existing stream that already has these settings is added again, which the server answers
        from what it holds; an update, even of nothing, is a change the cluster's nodes agree on, and
        every process puts every stream at start, often while another has just made it. A stream
        whose settings differ is updated at once, without the add that the server would refuse."""
        assert config.name is not None  # the project's streams are named
        if current is None:
            try:
                await self.create(config.name, lambda n: self._js.add_stream(config.evolve(num_replicas=n)))
                return
            except BadRequestError as exc:
                if exc.err_code != STREAM_EXISTS:
                    raise
                current = await stream_config(self._js, config.name)
                assert current is not None  # the server said it exists
        changed = differences(config, current)
        if not changed and self.target(current.num_replicas) == current.num_replicas:
            try:
                await self._js.add_stream(config.evolve(num_replicas=current.num_replicas))
                return
            except BadRequestError as exc:  # a setting this config leaves to the server's default differs
                if exc.err_code != STREAM_EXISTS:
                    raise
        if changed:
            log.info("stream %s exists with other settings (%s): updating it to these", config.name, ", ".join(changed))
        await self.update(
            config.name,
            current.num_replicas or 1,  # a stream the server describes names its copies
            lambda n: self._js.update_stream(config.evolve(num_replicas=n)),
        )

    async def create(self, name: str, make):
        """``make(replicas)``: a new stream; with one copy when automatic replicas cannot be placed."""
        try:
            return await make(self.replicas)
        except APIError as exc:
            if exc.err_code not in _PLACEMENT_ERRORS or self.replicas == 1:
                raise
            if self.wanted is not None:
                raise ConfigError(
                    f"--stream-replicas {self.wanted}: NATS cannot place {self.wanted} copies of "
                    f"{name}: {exc.description}"
                ) from None
            log.warning(
                "%s: NATS cannot place %d copies (%s): one copy, which a lost node takes with it",
                name,
                self.replicas,
                exc.description,
            )
            self.replicas = 1
            return await make(1)

    async def update(self, name: str, current: int, change):
        """``change(replicas)``: an existing stream updated; its replicas kept, and said so, when the
        server refuses to change them."""
        target = self.target(current)
        if target != current:
            log.info("%s: %d copies (was %d)", name, target, current)
        try:
            return await change(target)
        except APIError as exc:
            if target == current:
                raise
            log.warning("%s keeps %d copies: NATS refused %d (%s)", name, current, target, exc.description)
            return await change(current)


def differences(config: StreamConfig, current: StreamConfig) -> list[str]:
    """The settings ``config`` gives (its fields that are not None, replicas aside) that ``current`` has otherwise."""
    given = {k: v for k, v in config.as_dict().items() if k != "num_replicas"}
    have = current.as_dict()
    return sorted(k for k, v in given.items() if have.get(k) != v)


async def stream_config(js: JetStreamContext, name: str) -> StreamConfig | None:
    try:
        return (await js.stream_info(name)).config
    except NotFoundError:
        return None
