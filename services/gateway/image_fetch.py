"""Images a request names by URL, fetched from the hosts --image-hosts lists and from nowhere else.

A gateway that fetches what a client names is a server-side request forgery risk (SSRF): it sits where
the client cannot, beside internal services and cloud metadata endpoints. So, before any byte is read:

- the URL's scheme, host and port must be an entry of --image-hosts (host names exact, case-insensitive):
  https on 443 for a bare name, another port only where the entry names it, http only where the entry
  says ``http://host``; a URL with user info (``user@host``) is refused;
- the host is resolved here and every address it resolves to checked: a loopback, private, link-local,
  multicast or otherwise non-public one refuses the URL, unless --image-hosts-private names the host
  (then only multicast and unspecified addresses are refused). The connection is made to a checked
  address, the name sent as Host and as TLS SNI (the certificate checked against the name): a DNS
  answer that changes between the check and the connection (rebinding) cannot lead elsewhere;
- no redirect is followed, no proxy of the environment is used, no connection is kept for another fetch
  (one made for one name never carries another's request).

The body is read up to --max-image-bytes (a Content-Length over it refused before reading), the images of
one request together up to the larger of --max-body-bytes and --max-image-bytes, all of them within 10 s
(less where --request-timeout is shorter), 8 at a time; a compressed body (Content-Encoding)
is refused, as a small gzip body can inflate a thousandfold. The file is then checked as a data URI's is
(services/gateway/images.py). Anything refused is a 400 naming the input, the URL and why.

httpx is imported only where --image-hosts lists hosts: a gateway that fetches nothing never needs it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from embedfleet.services.gateway.images import ImageHeader, ImageUrl, checked_file, placed, refused
from embedfleet.services.gateway.inputs import Inputs
from embedfleet.shared import __version__
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.errors import shown
from embedfleet.shared.images.decode import ImageError, ImageLimits

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("embedfleet.gateway")

FETCH_SECONDS = 10.0  # one image's resolution, connection and body, at most (and --request-timeout at most)
FETCHES_AT_ONCE = 8  # of one request's images
PORTS = {"https": 443, "http": 80}
_ENTRY = "an entry of --image-hosts is a host name, host:port, https://host[:port] or http://host[:port]"


@dataclass(frozen=True, slots=True)
class Origin:
    """Where images may come from: a scheme, a host (lower case; an IPv6 address without brackets), a port."""

    scheme: str  # "https" or "http"
    host: str
    port: int

    @property
    def netloc(self) -> str:
        """The Host header's value: the host, and the port where it is not the scheme's own."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == PORTS[self.scheme] else f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.netloc}"


def origin_of(entry: str) -> Origin:
    """An entry of --image-hosts as an Origin (a bare name: https on 443); ConfigError when it is not one."""
    text = entry.strip()
    scheme, sep, rest = text.partition("://")
    scheme, rest = (scheme.lower(), rest) if sep else ("https", text)
    if scheme not in PORTS or not rest or any(c in rest for c in "/?#@*\\ ") or rest.startswith("."):
        raise ConfigError(f"--image-hosts {entry!r}: {_ENTRY} (exact names: no path, user, or wildcard)")
    try:
        parts = urlsplit(f"{scheme}://{rest}")
        host, port = parts.hostname, parts.port
    except ValueError:
        host = None
    if not host or not host.isascii():
        raise ConfigError(f"--image-hosts {entry!r}: {_ENTRY} (a host in ASCII: punycode for others)")
    return Origin(scheme, host.rstrip("."), port or PORTS[scheme])


@dataclass(frozen=True, slots=True)
class Target:
    """A URL once checked against --image-hosts: its origin, and the path and query to ask for."""

    origin: Origin
    path: str  # "/cat.png?size=2"


@dataclass(frozen=True, slots=True)
class ImageHosts:
    """--image-hosts (none: no URL is fetched) and the hosts among them --image-hosts-private names."""

    origins: frozenset[Origin] = frozenset()
    private: frozenset[str] = frozenset()  # hosts that may resolve to loopback, private or link-local addresses

    @classmethod
    def of(cls, entries: Iterable[str], private: Iterable[str] = ()) -> ImageHosts:
        origins = frozenset(origin_of(entry) for entry in entries)
        names = frozenset(name.strip().lower().rstrip(".") for name in private)
        if stray := sorted(names - {o.host for o in origins}):
            raise ConfigError(
                f"--image-hosts-private names hosts of --image-hosts (a host name, no scheme or port); "
                f"{', '.join(stray)} is not one"
            )
        return cls(origins, names)

    def target(self, url: str) -> Target:
        """``url`` checked against the hosts without a network call: ImageError when it is not fetched."""
        if not self.origins:
            raise ImageError(
                f"the URL {shown(url)} is not fetched: the gateway fetches images only from the hosts its "
                "--image-hosts option lists, and it lists none; send the image as a data URI (data:image/png;base64,...)"
            )
        if not url.isascii() or any(c <= " " or c == "\x7f" for c in url):
            raise ImageError(f"the URL {shown(url)} holds spaces, control or non-ASCII characters: percent-encode them")
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in PORTS:
            raise ImageError(
                f"the URL {shown(url)} is not fetched: only https:// URLs are (and http:// ones from a host "
                "--image-hosts lists as http://host)"
            )
        if "@" in parts.netloc:
            raise ImageError(f"the URL {shown(url)} holds a user name or password (user@host): it is not fetched")
        try:
            host, port = (parts.hostname or "").rstrip("."), parts.port or PORTS[scheme]
        except ValueError:  # a port that is not a number, or past 65535
            raise ImageError(f"the URL {shown(url)} has an invalid port") from None
        if not host:
            raise ImageError(f"the URL {shown(url)} names no host")
        origin = Origin(scheme, host, port)
        if origin not in self.origins:
            raise ImageError(self._why_not(origin, url))
        return Target(origin, (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))

    def _why_not(self, origin: Origin, url: str) -> str:
        same_host = sorted(str(o) for o in self.origins if o.host == origin.host)
        if not same_host:
            return f"the host {origin.host!r} of {shown(url)} is not among the hosts the gateway's --image-hosts lists"
        return (
            f"{origin} is not among the gateway's --image-hosts, which lists {', '.join(same_host)} for {origin.host!r}"
        )


def address_refused(address: str, private: bool) -> str | None:
    """Why an image is not fetched from ``address`` (None: it may be): ``private``, the host is one that
    --image-hosts-private names."""
    ip = ipaddress.ip_address(address.partition("%")[0])  # an IPv6 link-local address may carry a zone
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:10.0.0.1 reaches 10.0.0.1
    if ip.is_multicast or ip.is_unspecified:
        return "a multicast address" if ip.is_multicast else "the unspecified address"
    if ip.is_global or private:
        return None
    for kind in ("loopback", "link_local", "private"):  # the narrowest first: 127.0.0.1 is private too
        if getattr(ip, f"is_{kind}"):
            return f"a {kind.replace('_', '-')} address"
    return "a non-public address"  # 100.64.0.0/10 (carrier-grade NAT) and ranges reserved otherwise


async def addresses(origin: Origin, private: bool) -> list[str]:
    """The addresses ``origin``'s host resolves to, each checked (``address_refused``): ImageError if any is refused."""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(origin.host, origin.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ImageError(f"the host {origin.host!r} cannot be resolved ({exc})") from None
    listed = list(dict.fromkeys(str(info[4][0]) for info in found))
    for address in listed:
        if (why := address_refused(address, private)) is not None:
            hint = "" if private else " (--image-hosts-private may name a host of the gateway's own network)"
            raise ImageError(
                f"the host {origin.host!r} resolves to {address}, {why}: images are not fetched from it{hint}"
            )
    return listed


class _Budget:
    """The bytes one request's fetched images may hold together."""

    def __init__(self, limit: int) -> None:
        self.limit = self.left = limit

    def take(self, size: int) -> None:
        self.left -= size
        if self.left < 0:
            raise ImageError(
                f"the request's images at URLs hold over {self.limit} bytes together (the larger of the gateway's "
                "--max-body-bytes and --max-image-bytes): send fewer in one request"
            )


class ImageFetcher:
    """The gateway's fetcher of image URLs: one httpx client (made by ``open``, in the application's
    lifespan, where hosts are listed), the checks of the module's docstring."""

    def __init__(self, hosts: ImageHosts, limits: ImageLimits, max_total: int, timeout: float = FETCH_SECONDS) -> None:
        self.hosts = hosts
        self.limits = limits
        self.max_total = max(max_total, limits.max_bytes)  # one image within its own limit always fits
        self.timeout = min(timeout, FETCH_SECONDS)
        self._client: httpx.AsyncClient | None = None

    def open(self, verify: ssl.SSLContext | bool = True) -> None:
        """The client, where hosts are listed; ``verify``: the CAs the hosts' certificates are checked against
        (True: httpx's own, certifi's)."""
        if not self.hosts.origins or self._client is not None:
            return
        import httpx

        self._client = httpx.AsyncClient(
            verify=verify,
            follow_redirects=False,
            trust_env=False,  # no proxy or .netrc of the environment: the connection goes to the checked address
            timeout=httpx.Timeout(self.timeout),
            limits=httpx.Limits(max_connections=100, max_keepalive_connections=0),
            headers={"user-agent": f"embedfleet/{__version__}", "accept": "image/*", "accept-encoding": "identity"},
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def completed(self, images: Inputs, urls: Sequence[ImageUrl]) -> Inputs:
        """``images`` (a request's images sent inline) with those ``urls`` name fetched, in their places."""
        if not urls:
            return images
        files = [file for file, _ in await self.checked(urls)]
        return Inputs([], None, placed(images.images or [], urls, files))

    async def checked(self, urls: Sequence[ImageUrl]) -> list[tuple[bytes, ImageHeader]]:
        """The files ``urls`` name, each checked as a data URI's file is, with its header; every URL is
        checked against the hosts before any is fetched. ApiError (400) naming the first refused."""
        targets = []
        for url in urls:
            try:
                targets.append(self.hosts.target(url.url))
            except ImageError as exc:
                raise refused(url.where, exc) from None
        deadline = asyncio.get_running_loop().time() + self.timeout
        budget, turns = _Budget(self.max_total), asyncio.Semaphore(FETCHES_AT_ONCE)

        async def one(url: ImageUrl, target: Target) -> tuple[bytes, ImageHeader]:
            try:
                async with asyncio.timeout_at(deadline), turns:
                    data = await self._fetch(url.url, target, budget)
            except TimeoutError:
                exc = ImageError(f"{shown(url.url)} was not fetched within {self.timeout:g} s")
                raise refused(url.where, exc) from None
            except ImageError as exc:
                raise refused(url.where, exc) from None
            return checked_file(data, url.where, self.limits)

        if len(urls) == 1:
            return [await one(urls[0], targets[0])]
        try:
            async with asyncio.TaskGroup() as group:  # the first refused cancels the others
                tasks = [group.create_task(one(url, target)) for url, target in zip(urls, targets)]
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None
        return [task.result() for task in tasks]

    async def _fetch(self, url: str, target: Target, budget: _Budget) -> bytes:
        """The body ``url`` answers, from the first checked address that takes the connection."""
        import httpx

        assert self._client is not None, "ImageFetcher.open() runs in the lifespan, before the first request"
        origin, started = target.origin, time.perf_counter()
        listed = await addresses(origin, origin.host in self.hosts.private)
        for i, address in enumerate(listed):
            where = httpx.URL(scheme=origin.scheme, host=address, port=origin.port, raw_path=target.path.encode())
            try:
                data = await self._get(url, where, target, budget)
            except httpx.ConnectError as exc:  # refused, unreachable, or a TLS handshake or certificate refused
                if i + 1 < len(listed):
                    continue
                raise ImageError(f"{shown(url)} was not fetched: connecting to {origin} failed ({exc})") from None
            except httpx.TimeoutException:
                raise TimeoutError from None
            except httpx.HTTPError as exc:  # the connection broke, or the answer is not HTTP
                raise ImageError(f"{shown(url)} was not fetched: {type(exc).__name__} ({exc})") from None
            ms = (time.perf_counter() - started) * 1000
            log.debug("image fetched: %s from %s, %d bytes in %.1f ms", origin, address, len(data), ms)
            return data
        raise AssertionError("getaddrinfo answers at least one address or raises")

    async def _get(self, url: str, where: httpx.URL, target: Target, budget: _Budget) -> bytes:
        assert self._client is not None
        origin, limit = target.origin, self.limits.max_bytes
        sni = {"sni_hostname": origin.host} if origin.scheme == "https" else {}
        headers = {"host": origin.netloc}
        async with self._client.stream("GET", where, headers=headers, extensions=sni) as response:
            status = f"{response.status_code} {response.reason_phrase}".strip()
            if 300 <= response.status_code < 400:
                to = response.headers.get("location")
                raise ImageError(
                    f"{shown(url)} answered {status}"
                    + (f" (to {shown(to)})" if to else "")
                    + ": redirects are not followed; send the URL the image is at"
                )
            if not response.is_success:
                raise ImageError(f"{shown(url)} answered {status}, not the image")
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise ImageError(
                    f"{shown(url)} answered a compressed body (Content-Encoding: {encoding}): images are "
                    "fetched as they are stored"
                )
            length = response.headers.get("content-length", "")
            if length.isdigit() and int(length) > limit:
                raise ImageError(_too_large(url, f"is {int(length)} bytes", limit))
            data = bytearray()
            async for chunk in response.aiter_raw():
                data += chunk
                budget.take(len(chunk))
                if len(data) > limit:
                    raise ImageError(_too_large(url, f"holds over {limit} bytes", limit))
            return bytes(data)


def _too_large(url: str, size: str, limit: int) -> str:
    return f"the image at {shown(url)} {size}, over the limit of {limit} bytes (--max-image-bytes): not read further"
