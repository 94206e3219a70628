"""uvicorn's httptools protocol with limits on what a client may send before the application sees it.

uvicorn bounds none of this: a request's headers are parsed whole, however large, before any ASGI
middleware runs (an API-key check included), and a client may take forever to send them or its body.
Here, per connection:

- the request target and header fields may take ``max_header_bytes`` and number ``max_headers``:
  beyond, 431 and the connection is closed. httptools hands a header over only once it is complete, so
  the bytes received while the headers are incomplete are counted too: one endless header is cut off
  after ``max_header_bytes`` plus one read, not buffered whole;
- the request line and headers must arrive within ``header_timeout`` seconds of the connection (or of
  the request's first byte on a kept-alive one), the body within ``body_timeout`` of the headers'
  end: slower, 408 and the connection is closed (a slow-loris client holds a socket, never a slot
  among --max-in-flight for long).

These answers are plain text: they come before any route is known.

Each request's scope carries a ``Departure`` (services/gateway/http/disconnects.py), told when the client
goes away (or its body is cut off as too slow) before its answer is complete.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from embedfleet.services.gateway.config import HttpLimits
from embedfleet.services.gateway.http.disconnects import DEPARTURE, Departure, departure_of

log = logging.getLogger("embedfleet.gateway.http")

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class Refused(Exception):
    """A request the limits refuse before the application sees it: the status and why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class _HeadWithBody:
    """A response's transport that holds its status line and headers until its first body bytes, so
    both go out in one write: one system call and one TCP segment instead of two (uvicorn writes them
    apart). The head is the first write after the response started (a "100 Continue" comes before)."""

    __slots__ = ("_transport", "_cycle", "_head", "_headed")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport = transport
        self._cycle = cycle
        self._head: bytes | None = None
        self._headed = False

    def write(self, data: bytes) -> None:
        if self._head is not None:
            data, self._head = self._head + data, None
        elif not self._headed and self._cycle.response_started:
            self._head, self._headed = data, True
            return
        self._transport.write(data)

    def close(self) -> None:
        if self._head is not None:
            self._transport.write(self._head)
            self._head = None
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class LimitedHttpProtocol(HttpToolsProtocol):
    """One HTTP/1.1 connection, under ``limits``."""

    def __init__(self, *args: Any, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._in_head = True  # the bytes arriving belong to a request's line and headers
        self._head_received = 0  # bytes received while in the head (an upper bound on its size)
        self._head_bytes = 0  # bytes of the target and header fields parsed so far
        self._header_count = 0
        self._timer: asyncio.TimerHandle | None = None  # the header or body deadline

    # -- deadlines ----------------------------------------------------------------------------

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._too_slow, what, seconds)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _too_slow(self, what: str, seconds: float) -> None:
        self._timer = None
        if what == "body" and self.cycle is not None and self.cycle.response_started:
            return  # the application answered already; the body it no longer needs may take its time
        self._refuse(Refused(408, f"the request's {what} took over {seconds:g}s"), what == "body")

    # -- the connection -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._depart()
        super().connection_lost(exc)

    def _depart(self) -> None:
        """Tell the request being answered, if any, that its client is gone."""
        if self.cycle is not None and not self.cycle.response_complete:
            departure = departure_of(self.cycle.scope)
            if departure is not None:
                departure.leave()

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        if self._in_head:
            self._head_received += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, Refused):  # raised by a callback below
                self._refuse(exc.__context__)
            else:
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
            return
        if self._in_head and self._head_received > self.limits.max_header_bytes:  # one header without end
            self._refuse(Refused(431, f"request headers over {self.limits.max_header_bytes} bytes"))

    def _refuse(self, refused: Refused, in_body: bool = False) -> None:
        """Answer ``refused`` and close; ``in_body``: the application has the request, and is told it is gone."""
        self._disarm()
        peer = f"{self.client[0]}:{self.client[1]}" if self.client else "?"
        log.warning("refused a request from %s with %d: %s", peer, refused.status, refused.reason)
        if in_body and self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the application's receive() says the client is gone
            self.cycle.message_event.set()
            self._depart()
        body = refused.reason.encode()
        self.transport.write(
            b"".join(
                (
                    b"HTTP/1.1 %d %s\r\n" % (refused.status, _REASONS[refused.status]),
                    b"content-type: text/plain; charset=utf-8\r\n",
                    b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body),
                    body,
                )
            )
        )
        self.transport.close()

    # -- parser callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # ASGI extensions hold any values; uvicorn's scope type says dicts
        self.scope["extensions"] = {DEPARTURE: Departure()}  # type: ignore[dict-item]
        self._head_bytes = self._header_count = 0
        if self._timer is None:  # a kept-alive connection's next request
            self._arm(self.limits.header_timeout, "headers")

    def on_url(self, url: bytes) -> None:
        self._count(len(url), 0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4, 1)  # "name: value\r\n"
        super().on_header(name, value)

    def _count(self, size: int, headers: int) -> None:
        self._head_bytes += size
        self._header_count += headers
        if self._head_bytes > self.limits.max_header_bytes:
            raise Refused(431, f"request headers over {self.limits.max_header_bytes} bytes")
        if self._header_count > self.limits.max_headers:
            raise Refused(431, f"over {self.limits.max_headers} header fields")

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._arm(self.limits.body_timeout, "body")
        previous = self.cycle
        super().on_headers_complete()
        if self.cycle is not previous:  # a new request's cycle, whose application task has not run yet
            # a stand-in with the calls the cycle makes on its transport, not a Transport subclass
            self.cycle.transport = _HeadWithBody(self.transport, self.cycle)  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_head, self._head_received = True, 0
        super().on_message_complete()
        if not self.pipeline:
            # the body of the request being answered is in: read on, so that its client's leaving is seen
            # (connection_lost) while the answer is made. uvicorn stops reading past 64 KB of body and
            # reads again only when the application asks for more; a request whose last read took it past
            # that would otherwise never learn of its client leaving. A pipelined request keeps the pause.
            self.flow.resume_reading()


def protocol(limits: HttpLimits) -> functools.partial:
    """The protocol factory to give uvicorn as ``http``."""
    return functools.partial(LimitedHttpProtocol, limits=limits)
