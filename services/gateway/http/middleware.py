"""One ASGI middleware for what every route shares: request ids, trace context, what keeps web pages off
(Host, Origin, a JSON body's Content-Type, CORS: services/gateway/http/browser.py), API keys, the media types
a client accepts (services/gateway/http/route_media.py), admission, timing, metrics, and clients that go away
(services/gateway/http/disconnects.py)."""

from __future__ import annotations

import functools
import logging
import os
import re
import time

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from embedfleet.services.gateway.auth import ApiKeys
from embedfleet.services.gateway.http.admission import Admission
from embedfleet.services.gateway.http.browser import BrowserGuard, BrowserRules, default_hosts
from embedfleet.services.gateway.http.disconnects import departure_of, run_departing, run_watched
from embedfleet.services.gateway.http.endpoints import Endpoints
from embedfleet.services.gateway.http.errors import error_response
from embedfleet.services.gateway.http.limits import KeyLimits, bind_key
from embedfleet.services.gateway.http.route_media import RouteMedia
from embedfleet.services.gateway.metrics import Metrics
from embedfleet.services.gateway.routes import EMBED_PATHS
from embedfleet.shared.config.registry import default
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.observability.tracing import TRACEPARENT, TraceContext, Tracer, bind

log = logging.getLogger("embedfleet.gateway")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_TRACEPARENT = TRACEPARENT.encode()


class _Seen:
    """The headers every request is read for: the first of each, but Accept (its fields joined, as one list)."""

    __slots__ = (
        "request_id",
        "traceparent",
        "authorization",
        "accept",
        "host",
        "origin",
        "content_type",
        "preflight",
    )

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        # one pass (uvicorn gives header names in lowercase)
        self.request_id = self.traceparent = self.authorization = self.accept = None
        self.host = self.origin = self.content_type = self.preflight = None  # preflight: the method it asks
        for name, value in raw:
            field = _FIELDS.get(name)
            if field is None:
                continue
            if field == "accept":
                text = value.decode("latin-1")
                self.accept = text if self.accept is None else f"{self.accept},{text}"
            elif getattr(self, field) is None:
                setattr(self, field, value.decode("latin-1"))


_FIELDS = {
    b"x-request-id": "request_id",
    _TRACEPARENT: "traceparent",
    b"authorization": "authorization",
    b"accept": "accept",
    b"host": "host",
    b"origin": "origin",
    b"content-type": "content_type",
    b"access-control-request-method": "preflight",
}


class GatewayMiddleware:
    """The gateway's outermost ASGI layer. ``app``: the starlette app; ``endpoints``: its routes run
    straight from here (services/gateway/http/endpoints.py), None: every request goes through ``app``."""

    def __init__(
        self,
        app: ASGIApp,
        keys: ApiKeys,
        metrics: Metrics,
        routes: frozenset[str],
        tracer: Tracer,
        limits: KeyLimits | None = None,
        admission: Admission | None = None,
        endpoints: Endpoints | None = None,
        browser: BrowserGuard | None = None,
    ) -> None:
        self.app = app
        self.admission = admission or Admission(default("max_in_flight"), metrics.in_flight)
        self.keys = keys
        self.limits = limits or KeyLimits()
        self.metrics = metrics
        self.routes = routes
        self.tracer = tracer
        self.endpoints = endpoints
        self.media = RouteMedia()
        self.browser = browser or BrowserGuard(BrowserRules(default_hosts(default("host"))))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        seen = _Seen(scope["headers"])
        given = seen.request_id
        request_id = given if given and _REQUEST_ID.match(given) else os.urandom(16).hex()
        method, path = scope["method"], scope["path"]
        route = path if path in self.routes else "other"  # unknown paths share one label
        status = 500
        # the client's trace continues here (a malformed traceparent starts a new one, as the spec says)
        span = self.tracer.start(
            f"{method} {route}",
            TraceContext.parse(seen.traceparent),
            "server",
            **{"http.request.method": method, "url.path": path, "http.route": route},
            request_id=request_id,
        )
        bind(span.context, request_id)  # this request's task: log lines and NATS messages carry it

        async def send_with_headers(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [
                    *message["headers"],
                    (b"x-request-id", request_id.encode()),
                    (_TRACEPARENT, span.context.header.encode()),
                    (b"x-total-time", b"%d" % round((time.perf_counter() - start) * 1000)),
                ]
            await send(message)

        respond: Send = send_with_headers
        preflight = seen.preflight is not None and seen.origin is not None and method == "OPTIONS"
        if seen.origin is not None and not preflight and self.browser.rules.origin_allowed(seen.origin):
            # an allowed web page's request: its answer says the page may read it (CORS)
            respond = functools.partial(
                self.browser.send_cors, send=send_with_headers, request_headers=Headers(scope=scope)
            )
        key = self.keys.identify(seen.authorization)
        gone = False  # the client went away before its answer
        try:
            refusal = self._browser_refusal(scope, seen) or self._refusal(scope, key, seen)
            if refusal is not None:
                await refusal(scope, receive, respond)
            elif self.admission.exempt(method, path):
                await self._run(scope, receive, respond)
            else:
                try:
                    gone = await self._run(scope, receive, respond)
                finally:
                    self.admission.leave()
        finally:
            span.set(**{"http.response.status_code": status})
            if gone:  # one line, no traceback: a client may leave, the gateway is not at fault
                log.info(
                    "%s %s: the client went away after %.3fs, before its answer",
                    method,
                    path,
                    time.perf_counter() - start,
                )
                span.error("disconnected", "the client went away")
            elif status >= 500:
                span.error(str(status), "server error")
            span.end()
            self.metrics.observe(route, "disconnected" if gone else status)
            if route in EMBED_PATHS and status < 400 and not gone:
                self.metrics.child(self.metrics.stage_seconds, "total").observe(time.perf_counter() - start)

    async def _run(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer the request; True when its client went away before its answer (services/gateway/http/disconnects.py)."""
        endpoints = self.endpoints
        endpoint = None if endpoints is None else endpoints.get(scope["method"], scope["path"])
        app = self.app if endpoints is None or endpoint is None else functools.partial(endpoints.run, endpoint)
        departure = departure_of(scope)
        if departure is None:
            return await run_watched(app, scope, receive, send)
        return await run_departing(app, scope, receive, send, departure)

    def _browser_refusal(self, scope: Scope, seen: _Seen) -> Response | None:
        """The answer to a request no web page may make, before its key is looked at: a Host the gateway
        is not served as, an Origin not allowed (403); an allowed origin's preflight (OPTIONS), answered."""
        method, path = scope["method"], scope["path"]
        refused = self.browser.refusal(seen.host, seen.origin)
        if refused is not None:
            return refused.response(path)
        if seen.preflight is not None and seen.origin is not None and method == "OPTIONS":
            return self.browser.preflight(Headers(scope=scope))
        return None

    def _refusal(self, scope: Scope, key: str | None, seen: _Seen) -> Response | None:
        """The answer to a request refused before any route: no API key (401), a JSON route's body said to be
        another type (415), an Accept its route cannot answer (406), a gateway at its --max-in-flight or a key
        over its limits (429); None: admitted, its slot taken (unless a probe)."""
        path = scope["path"]
        if self.keys.enabled and key is None and path not in self.keys.open_paths:
            response = error_response(
                path, ErrorCode.UNAUTHORIZED, "missing or unknown API key: send 'Authorization: Bearer <key>'"
            )
            response.headers["www-authenticate"] = "Bearer"
            return response
        if (unsupported := self.browser.media_refusal(scope["method"], path, seen.content_type)) is not None:
            return unsupported.response(path)
        if (unacceptable := self.media.refusal(scope["method"], path, seen.accept)) is not None:
            return unacceptable.response(path)
        exempt = self.admission.exempt(scope["method"], path)
        if not exempt and not self.admission.enter():
            return error_response(
                path,
                ErrorCode.OVERLOADED,
                f"the gateway is handling {self.admission.taken} requests, its limit; retry later",
            )
        refusal = None if path in self.keys.open_paths else self._limited(path, key)
        if refusal is not None and not exempt:
            self.admission.leave()
        return refusal

    def _limited(self, path: str, key: str | None) -> Response | None:
        """A 429 answer when ``key`` is over one of its per-minute limits, else None (the request is
        admitted and counted under the key, which routes charge its tokens to)."""
        bind_key(key)
        refused = self.limits.admit(key) if key is not None and self.limits.enabled else None
        if refused is None:
            self.metrics.key_request(key, "admitted")
            return None
        self.metrics.key_request(key, "limited")
        limit, wait = refused
        per_minute = self.limits.requests if limit == "requests" else self.limits.tokens
        response = error_response(
            path,
            ErrorCode.OVERLOADED,
            f"this API key is over its limit of {per_minute} {limit} a minute; retry in {wait}s",
        )
        response.headers["retry-after"] = str(wait)
        return response
