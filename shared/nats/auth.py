"""NATS credentials and TLS: what a service proves itself with, checked once, and the keyword
arguments nats-py's ``connect`` takes for them.

Secrets (a password, a token) come from files or environment variables, or inside the URL
(``nats://USER:PASSWORD@HOST``, ``nats://TOKEN@HOST``); the URL a service keeps has them moved
out (``split_credentials``), so that URL can be logged. Errors are ValueErrors whose message names
the option; ``embedfleet.shared.nats.config`` turns them into ConfigErrors.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

_USERINFO = re.compile(r"(^|://|,|\s)[^/@\s,]*@")  # user info: after a scheme, or a URL without one


def redact(text: str) -> str:
    """``text`` with the user info of every URL in it replaced: ``nats://***@host:4222``."""
    return _USERINFO.sub(r"\1***@", text)


def split_credentials(urls: str) -> tuple[str, str | None, str | None]:
    """(the comma-separated ``urls`` without user info, the user, the password).

    A user without a password is a token (``nats://TOKEN@host``), as nats-py reads it. Every URL that
    carries credentials must carry the same ones: they are given to the connection, not to one server.
    """
    clean: list[str] = []
    found: set[tuple[str, str | None]] = set()
    for url in urls.split(","):
        parts = urlsplit(url.strip())
        if "@" not in parts.netloc:
            clean.append(url.strip())
            continue
        userinfo, _, hostport = parts.netloc.rpartition("@")
        user, colon, password = userinfo.partition(":")
        found.add((unquote(user), unquote(password) if colon else None))
        clean.append(urlunsplit(parts._replace(netloc=hostport)))
    if len(found) > 1:
        raise ValueError(f"--nats {redact(urls)}: the URLs carry different credentials; give one set")
    who, secret = found.pop() if found else ("", None)
    return ",".join(clean), who or None, secret


def read_secret(path: str, option: str) -> str:
    """The first line of the file ``path`` (a password or a token), without its line end."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot read it ({exc.strerror or exc})") from None
    secret = text.splitlines()[0] if text else ""
    if not secret:
        raise ValueError(f"{option} {path}: the file is empty")
    return secret


def _check_nkey_seed(path: str) -> str:
    """The public key of the user nkey seed in ``path`` (nats-py reads the file again on each connect)."""
    import nkeys

    seed = read_secret(path, "--nats-nkey-seed").strip()
    if not seed.startswith("SU"):
        raise ValueError(f"--nats-nkey-seed {path}: not a user nkey seed (one line starting with SU)")
    try:
        pair = nkeys.from_seed(bytearray(seed.encode()))
    except Exception as exc:  # nkeys raises its own errors for bad encodings and checksums
        raise ValueError(f"--nats-nkey-seed {path}: not a valid nkey seed ({exc})") from None
    public = pair.public_key.decode()
    pair.wipe()
    return public


def _check_creds(path: str) -> None:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"--nats-creds {path}: cannot read it ({exc.strerror or exc})") from None
    if "BEGIN NATS USER JWT" not in text or "BEGIN USER NKEY SEED" not in text:
        raise ValueError(f"--nats-creds {path}: not a NATS credentials file (a user JWT and its nkey seed)")


@dataclass(frozen=True, slots=True)
class NatsAuth:
    """How a service proves who it is: one of a user and password, a token, a user nkey seed file,
    or a credentials file (user JWT + nkey seed, for servers in operator mode); nothing when all are
    unset. Secrets stay out of ``repr``."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    nkey_seed: str | None = None  # path of a file holding a user nkey seed (SU...)
    creds: str | None = None  # path of a .creds file

    def __post_init__(self) -> None:
        ways = [
            name
            for name, given in (
                ("user and password", self.user is not None or self.password is not None),
                ("token", self.token is not None),
                ("--nats-nkey-seed", self.nkey_seed is not None),
                ("--nats-creds", self.creds is not None),
            )
            if given
        ]
        if len(ways) > 1:
            raise ValueError(f"NATS credentials given {len(ways)} ways ({', '.join(ways)}): give one")
        if self.user is not None and not self.password:
            raise ValueError(
                f"--nats-user {self.user!r} needs a password: --nats-password-file FILE, "
                "$EMBEDFLEET_NATS_PASSWORD, or nats://USER:PASSWORD@HOST"
            )
        if self.password is not None and self.user is None:
            raise ValueError("a NATS password needs a user: --nats-user USER")
        if self.token == "":
            raise ValueError("the NATS token is empty")

    @property
    def method(self) -> str:
        """What the service authenticates with, for logs: never the secret itself."""
        if self.user is not None:
            return f"user {self.user!r} and a password"
        if self.token is not None:
            return "a token"
        if self.nkey_seed is not None:
            return f"the nkey seed in {self.nkey_seed}"
        if self.creds is not None:
            return f"the credentials file {self.creds}"
        return "no credentials"

    def check_files(self) -> None:
        """Fail now, with the option's name, on a seed or credentials file that cannot serve."""
        if self.nkey_seed is not None:
            _check_nkey_seed(self.nkey_seed)
        if self.creds is not None:
            _check_creds(self.creds)

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.aio.client.Client.connect``."""
        if self.user is not None:
            return {"user": self.user, "password": self.password}
        if self.token is not None:
            return {"token": self.token}
        if self.nkey_seed is not None:
            return {"nkeys_seed": self.nkey_seed}
        if self.creds is not None:
            return {"user_credentials": self.creds}
        return {}


def _no_passphrase() -> bytes:
    raise ValueError("--nats-tls-key: the key is encrypted; give it without a passphrase")


@dataclass(frozen=True, slots=True)
class NatsTls:
    """TLS towards NATS: the CA to verify the server with (default: the system's CAs), a client
    certificate and key for mutual TLS, and the name to verify the server's certificate against.

    TLS is negotiated when the server requires it (a server with a ``tls`` block does); these
    settings say how to verify it and what to show it.
    """

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    hostname: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            given, missing = (
                ("--nats-tls-cert", "--nats-tls-key") if self.key is None else ("--nats-tls-key", "--nats-tls-cert")
            )
            raise ValueError(f"{given} needs {missing}: a client certificate and its key go together")

    @property
    def enabled(self) -> bool:
        return self.ca is not None or self.cert is not None

    def context(self) -> ssl.SSLContext | None:
        """The client context (hostnames verified), or None to leave nats-py's default."""
        if not self.enabled:
            return None
        try:
            context = ssl.create_default_context(cafile=self.ca)  # only that CA when given
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--nats-tls-ca {self.ca}: cannot load it ({_reason(exc)})") from None
        if self.cert is not None:
            try:
                context.load_cert_chain(self.cert, self.key, password=_no_passphrase)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(
                    f"--nats-tls-cert {self.cert} / --nats-tls-key {self.key}: cannot load them ({_reason(exc)})"
                ) from None
        return context

    def connect_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        context = self.context()
        if context is not None:
            options["tls"] = context
        if self.hostname:
            options["tls_hostname"] = self.hostname
        return options


def _reason(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return exc.strerror or str(exc)
