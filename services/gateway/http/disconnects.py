"""A request's handling is cancelled when its client goes away: no NATS work, no slot among
--max-in-flight, is kept for an answer nobody will read.

The gateway's HTTP server (services/gateway/http/server.py) tells of it directly: each request's
scope carries a ``Departure`` (``scope["extensions"][DEPARTURE]``) that the server calls when the
connection is lost, or the body is too slow, before the answer is complete. The request then runs in
the server's own task, which that call cancels (``run_departing``): no task, event or wait of its own
per request.

Under another ASGI server (starlette's TestClient) the only news of a lost connection is the ASGI
``receive()``: it answers ``http.disconnect`` once the connection is closed (or once the response is
complete). There the handler reads its body through ``receive()`` as usual; once the body is in, a
watcher waits on ``receive()`` for the rest of the request and cancels the handler's task when the
client left before its answer was complete (``run_watched``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DEPARTURE = "embedfleet.departure"  # the scope extension of a request's Departure
_NO_BODY = {"type": "http.request", "body": b"", "more_body": False}


class Departure:
    """One request's news of its client leaving before the answer is complete, from the HTTP server."""

    __slots__ = ("_callback",)

    def __init__(self) -> None:
        self._callback: Callable[[], None] | None = None

    def on_leave(self, callback: Callable[[], None] | None) -> None:
        self._callback = callback

    def leave(self) -> None:
        """The client went away (called by the server, outside the request's task); told once."""
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()


def departure_of(scope: Mapping[str, Any]) -> Departure | None:  # an ASGI scope, or uvicorn's typed one
    extensions = scope.get("extensions")
    return None if extensions is None else extensions.get(DEPARTURE)


async def run_departing(app: ASGIApp, scope: Scope, receive: Receive, send: Send, departure: Departure) -> bool:
    """Run ``app`` on the request in this task; True when its client went away before the answer was
    complete (``departure`` told: the task is cancelled, and the cancellation ends here)."""
    task = asyncio.current_task()
    assert task is not None
    left = False

    def leave() -> None:
        nonlocal left
        left = True
        task.cancel()

    departure.on_leave(leave)
    try:
        await app(scope, receive, send)
    except asyncio.CancelledError:
        if not left:
            raise  # cancelled for another reason: the server shuts down
    except ClientDisconnect:  # the body's end never came: the server said the client is gone
        return True
    finally:
        departure.on_leave(None)
    if left and task.cancelling():
        task.uncancel()
    return left


def _has_body(scope: Scope) -> bool:
    headers = dict(scope["headers"])
    return b"transfer-encoding" in headers or headers.get(b"content-length", b"0").strip() not in (b"", b"0")


async def run_watched(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> bool:
    """Run ``app`` on the request; True when its client went away before the answer was complete (the
    handler then cancelled, or stopped by its body's end missing)."""
    gone = asyncio.Event()
    body_in = asyncio.Event()  # the handler has the whole body: the watcher may read receive()
    answered = False
    owed_empty_body = not _has_body(scope)  # the handler gets an empty body; uvicorn's goes to the watcher
    if owed_empty_body:
        body_in.set()

    async def app_receive() -> Message:
        nonlocal owed_empty_body
        if body_in.is_set():
            if owed_empty_body:
                owed_empty_body = False
                return dict(_NO_BODY)
            await gone.wait()
            return {"type": "http.disconnect"}
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
        elif not message.get("more_body", False):
            body_in.set()
        return message

    async def app_send(message: Message) -> None:
        nonlocal answered
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            answered = True
        await send(message)

    async def watch() -> None:
        await body_in.wait()
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    # the request's context goes with it; ensure_future: an ASGI app returns an awaitable, not always a coroutine
    handler = asyncio.ensure_future(app(scope, app_receive, app_send))
    watcher = asyncio.create_task(watch())
    departure = asyncio.create_task(gone.wait())
    try:
        await asyncio.wait((handler, departure), return_when=asyncio.FIRST_COMPLETED)
        left = gone.is_set() and not answered
        if left:
            handler.cancel()
            with contextlib.suppress(asyncio.CancelledError, ClientDisconnect):
                await handler
            return True
        await handler
        return False
    finally:
        for task in (handler, watcher, departure):
            task.cancel()
        await asyncio.gather(watcher, departure, return_exceptions=True)
