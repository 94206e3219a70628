"""Where and how a process connects to NATS (``NatsConfig``), built from the NATS options the commands
share: the URL, the credentials and the TLS settings (``nats_security``, ``nats_config``), and the
environment that passes them on to a child process (``child_environment``).

NATS secrets (password, token) are read from files or environment variables only: a flag would show
them in ``ps``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.config.registry import declared, option
from embedfleet.shared.config.sections.nats import PASSWORD_ENV, TOKEN_ENV
from embedfleet.shared.nats.auth import NatsAuth, NatsTls, read_secret, redact, split_credentials
from embedfleet.shared.nats.subjects import Subjects


@dataclass(frozen=True, slots=True)
class NatsConfig:
    """Where and how to connect. ``url`` never carries credentials (``nats_config`` moves them into
    ``auth``), so it is safe to log."""

    url: str
    subjects: Subjects
    connect_timeout: float = 5.0
    ready_file: str | None = None  # written once the service serves, removed when it stops (probes)
    auth: NatsAuth = field(default_factory=NatsAuth)
    tls: NatsTls = field(default_factory=NatsTls)

    def __post_init__(self) -> None:
        for url in self.url.split(","):
            if "://" not in url:
                raise ConfigError(f"NATS URL {redact(url)!r} must look like nats://host:port")
        if redact(self.url) != self.url:
            raise ConfigError("NatsConfig.url must not carry credentials: give them as auth (nats_config does)")


# option -> environment variable, for every NATS credential and TLS option (embedfleet up passes them on)
NATS_SECURITY_ENV = {o.dest: o.env[0] for o in declared("gateway", ["nats"]) if o.flag.startswith("--nats-")}


def nats_security(ns: argparse.Namespace) -> tuple[str | None, NatsAuth, NatsTls]:
    """(the NATS URL without credentials, the credentials, the TLS settings) the options give.

    Credentials come from exactly one place: the URL, a user and password, a token, an nkey seed
    file or a credentials file; files must be readable and hold what they should.
    """
    opt = {name: getattr(ns, name, None) for name in NATS_SECURITY_ENV}
    try:
        url, url_user, url_secret = split_credentials(ns.nats) if ns.nats else (None, None, None)
        password = read_secret(opt["nats_password_file"], "--nats-password-file") if opt["nats_password_file"] else None
        token = read_secret(opt["nats_token_file"], "--nats-token-file") if opt["nats_token_file"] else None
        password_env, token_env = (
            option("nats_password").from_env(os.environ),
            option("nats_token").from_env(os.environ),
        )
        if password is not None and password_env is not None:
            raise ValueError(f"the NATS password is given twice: --nats-password-file and ${PASSWORD_ENV}")
        if token is not None and token_env is not None:
            raise ValueError(f"the NATS token is given twice: --nats-token-file and ${TOKEN_ENV}")
        password = password if password is not None else password_env
        token = token if token is not None else token_env
        user = opt["nats_user"]
        if url_user is not None:
            if user is not None or password is not None or token is not None:
                raise ValueError("NATS credentials are given both in the --nats URL and as options: give one")
            user, password, token = (url_user, url_secret, None) if url_secret is not None else (None, None, url_user)
        auth = NatsAuth(
            user=user, password=password, token=token, nkey_seed=opt["nats_nkey_seed"], creds=opt["nats_creds"]
        )
        auth.check_files()
        tls = NatsTls(
            ca=opt["nats_tls_ca"], cert=opt["nats_tls_cert"], key=opt["nats_tls_key"], hostname=opt["nats_tls_hostname"]
        )
        tls.context()  # loads the files: a bad one fails now, not at every reconnect
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return url, auth, tls


def nats_config(ns: argparse.Namespace) -> NatsConfig:
    try:
        subjects = Subjects(ns.subject_prefix)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    url, auth, tls = nats_security(ns)
    if url is None:
        raise ConfigError("--nats: no NATS URL given")
    return NatsConfig(url=url, subjects=subjects, ready_file=getattr(ns, "ready_file", None), auth=auth, tls=tls)


def child_environment(auth: NatsAuth, tls: NatsTls, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with the NATS credential and TLS variables replaced by the ones that make a child
    process (a service ``embedfleet up`` starts) connect with ``auth`` and ``tls``. Secrets travel in
    the environment, never in arguments, which ps shows."""
    names = NATS_SECURITY_ENV
    child = {k: v for k, v in base.items() if k not in (*names.values(), PASSWORD_ENV, TOKEN_ENV)}
    values = {
        names["nats_user"]: auth.user,
        PASSWORD_ENV: auth.password,
        TOKEN_ENV: auth.token,
        names["nats_nkey_seed"]: auth.nkey_seed and str(Path(auth.nkey_seed).resolve()),
        names["nats_creds"]: auth.creds and str(Path(auth.creds).resolve()),
        names["nats_tls_ca"]: tls.ca and str(Path(tls.ca).resolve()),
        names["nats_tls_cert"]: tls.cert and str(Path(tls.cert).resolve()),
        names["nats_tls_key"]: tls.key and str(Path(tls.key).resolve()),
        names["nats_tls_hostname"]: tls.hostname,
    }
    child.update({k: v for k, v in values.items() if v is not None})
    return child
