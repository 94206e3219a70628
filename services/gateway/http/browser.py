"""What keeps web pages off the gateway, as Jupyter and other local servers do: a page's script can
send a POST that needs no CORS preflight (``Content-Type: text/plain``, a form) to a gateway on
localhost, and a page whose name was made to resolve to 127.0.0.1 (DNS rebinding) can read the answers.

- ``Host``: a request must name the gateway as it is served (--allowed-hosts; by default localhost,
  its ``.localhost`` names, this machine's name and --host). An IP address is taken whatever the list:
  a rebinding page's Host is its own name, never an address.
- ``Origin``: a browser sends it on every cross-origin request (and every POST); one not among
  --allowed-origins is refused (none by default). A request without one (curl, SDKs) is not a page's.
- ``Content-Type``: a JSON route's body must say JSON, the one type a page cannot send without a
  preflight (one without a Content-Type, as some clients send, is read as JSON).

Refusals are 403 and 415, in the route's error shape. An allowed origin's page gets CORS: its preflight
(OPTIONS) answered, its answers readable (starlette's CORSMiddleware gives the headers).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import Message, Send

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.routes import ROUTES
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.errors import ErrorCode

ANY = "*"
# the request headers a page of an allowed origin may send, and the answers' headers it may read
_REQUEST_HEADERS = ("authorization", "content-type", "x-request-id", "traceparent", "tracestate")
_EXPOSED = (
    "x-request-id",
    "traceparent",
    "x-total-time",
    "x-tokenization-time",
    "x-queue-time",
    "x-inference-time",
    "retry-after",
    "www-authenticate",
)
_WILDCARD_BINDS = ("", "0.0.0.0", "::")
JSON_POSTS = frozenset(route.path for route in ROUTES if route.method == "POST")  # every POST body is JSON


def default_hosts(bind: str) -> tuple[str, ...]:
    """The names a gateway bound to ``bind`` is served as when --allowed-hosts gives none: localhost and
    its subdomains (browsers resolve them to loopback themselves), this machine's name, and ``bind``
    (addresses are taken whatever the list)."""
    names = ["localhost", ".localhost", socket.gethostname()]
    if bind not in _WILDCARD_BINDS:
        names.append(bind)
    return tuple(dict.fromkeys(name.lower().rstrip(".") for name in names if name))


def rules_of(hosts: tuple[str, ...], origins: tuple[str, ...], bind: str) -> BrowserRules:
    """The rules of --allowed-hosts (none: ``default_hosts(bind)``) and --allowed-origins, checked: an
    origin is ``scheme://host[:port]``, as a browser sends it (no path), or ``*``."""
    for origin in origins:
        scheme, sep, rest = origin.partition("://")
        if origin != ANY and (not sep or not scheme or not rest or "/" in rest.rstrip("/")):
            raise ConfigError(
                f"--allowed-origins: {origin!r} is no web origin; give scheme://host[:port] (https://app.example.com)"
            )
    # names are compared without their ports (a port given is dropped), in lowercase
    named = tuple(h if h == ANY else host_name(h) for h in hosts)
    return BrowserRules(named or default_hosts(bind), tuple(o if o == ANY else o.lower().rstrip("/") for o in origins))


def host_name(host: str) -> str:
    """The name (or address) of a Host header's value, without its port, in lowercase: ``[::1]:8080``
    is ``::1``, ``Example.COM.:80`` is ``example.com``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    if host.count(":") > 1:  # an IPv6 address without brackets (no port can be told from it)
        return host
    name, colon, port = host.rpartition(":")
    return (name if colon and port.isdigit() else host).rstrip(".")


def is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class BrowserRules:
    """``hosts``: the names the gateway is served as (``.example.com``: it and its subdomains; ``*``:
    any); ``origins``: the web origins (``https://app.example.com``) whose pages may call it (``*``: any)."""

    hosts: tuple[str, ...]
    origins: tuple[str, ...] = ()

    def host_allowed(self, host: str | None) -> bool:
        """Whether a request's Host header names the gateway (none: an HTTP/1.0 client, no browser)."""
        if host is None or ANY in self.hosts:
            return True
        name = host_name(host)
        if is_address(name):
            return True
        return any(name == allowed or (allowed.startswith(".") and name.endswith(allowed)) for allowed in self.hosts)

    def origin_allowed(self, origin: str) -> bool:
        return ANY in self.origins or origin.strip().lower().rstrip("/") in self.origins


class BrowserGuard:
    """The refusals and CORS answers of ``rules``, made once."""

    def __init__(self, rules: BrowserRules) -> None:
        self.rules = rules
        self._cors = CORSMiddleware(
            app=_never,
            allow_origins=rules.origins,
            allow_methods=sorted({route.method for route in ROUTES}),
            allow_headers=_REQUEST_HEADERS,
            expose_headers=_EXPOSED,
        )

    def refusal(self, host: str | None, origin: str | None) -> ApiError | None:
        """A 403 for a Host that does not name the gateway or an Origin not allowed; None: neither."""
        if not self.rules.host_allowed(host):
            return ApiError(
                ErrorCode.FORBIDDEN,
                f"Host {host_name(host or '')[:100]!r} is not a name this gateway is served as (--allowed-hosts)",
                "host",
            )
        if origin is not None and not self.rules.origin_allowed(origin):
            return ApiError(
                ErrorCode.FORBIDDEN,
                f"requests from web pages of origin {origin[:100]!r} are refused (--allowed-origins)",
                "origin",
            )
        return None

    @staticmethod
    def media_refusal(method: str, path: str, content_type: str | None) -> ApiError | None:
        """A 415 for a JSON route's body that says it is not JSON (a form, text/plain: what a page sends
        without a preflight); None: JSON, or not said, or no JSON route."""
        if method != "POST" or content_type is None or path not in JSON_POSTS or is_json(content_type):
            return None
        return ApiError(
            ErrorCode.UNSUPPORTED_MEDIA,
            f"{method} {path} takes a JSON body: send 'Content-Type: application/json' (not {content_type[:100]!r})",
            "content-type",
        )

    def preflight(self, scope_headers: Headers) -> Response:
        """The answer to an allowed origin's preflight (OPTIONS with Access-Control-Request-Method)."""
        return self._cors.preflight_response(request_headers=scope_headers)

    async def send_cors(self, message: Message, send: Send, request_headers: Headers) -> None:
        """``message`` sent with the CORS headers of an allowed origin's request."""
        await self._cors.send(message, send, request_headers)


def is_json(content_type: str) -> bool:
    """``application/json`` or ``application/<x>+json``, with any parameters (charset)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def _never(scope: object, receive: object, send: object) -> None:
    raise AssertionError("the CORS helper answers preflights and adds headers; it runs no app")
