"""What a real nats-server refuses a client: run an action as one user and collect the errors nats-py's
error callback hears (a permission violation comes as one, with no reply to the call that caused it)."""

from __future__ import annotations

import contextlib

import nats

from tests.support.waiting import eventually


async def refusals(url: str, seed: str, inbox: str, act, want: int, quiet: bool = True) -> list[str]:
    """What the server refused ``act(nc, js)`` (its errors, as nats-py's error callback hears them),
    run as the user of the nkey ``seed`` with replies under ``inbox``, once ``want`` errors came (or ten
    seconds passed). ``quiet``: an exception ``act`` raises is ignored (a refused call times out)."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(url, nkeys_seed=seed, error_cb=on_error, inbox_prefix=inbox, allow_reconnect=False)
    try:
        with contextlib.suppress(Exception) if quiet else contextlib.nullcontext():
            await act(nc, nc.jetstream())
        await nc.flush()
        with contextlib.suppress(TimeoutError):
            await eventually(lambda: len(errors) >= want, 10, f"{want} refusals")
    finally:
        await nc.close()
    return errors
