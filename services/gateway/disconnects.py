"""A request's handling is cancelled when its client goes away: no NATS work, no slot among
--max-in-flight, is kept for an answer nobody will read.

uvicorn tells of a lost connection only through the ASGI ``receive()``: it answers
``http.disconnect`` once the connection is closed (or once the response is complete). The handler
reads its body through ``receive()`` as usual; once the body is in, a watcher waits on ``receive()``
for the rest of the request and cancels the handler's task when the client left before its answer
was complete.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_NO_BODY = {"type": "http.request", "body": b"", "more_body": False}


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

    handler = asyncio.create_task(app(scope, app_receive, app_send))  # the request's context goes with it
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
