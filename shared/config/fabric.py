"""Configuration shared by every service, built from the options ``embedfleet.shared.config.registry`` declares.

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
from embedfleet.shared.config.registry import declared, from_options, option, setting
from embedfleet.shared.config.sections.bulk import MAX_JOB_HISTORY, MAX_REPLICAS
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


# Retention field -> environment variable (embedfleet up hands them to every service it starts)
RETENTION_ENV = {
    field: option(dest).env[0]
    for field, dest in (
        ("results_max_age", "results_max_age"),
        ("results_max_bytes", "results_max_bytes"),
        ("job_ttl", "job_ttl"),
        ("job_history", "job_history"),
        ("replicas", "stream_replicas"),
    )
}


@dataclass(frozen=True, slots=True)
class Retention:
    """How long bulk-job output is kept, set on the results stream and the job bucket by whichever
    process creates or meets them: a job's results for ``results_max_age`` seconds, or until the stream
    holds ``results_max_bytes`` (the oldest go first); a job's record for ``job_ttl`` seconds after its
    last change, ``job_history`` revisions of it. 0: no such limit. None: as the stream or bucket has
    it (the module's defaults when it is created), so a process given no retention changes none.
    ``replicas``: copies of every stream and the bucket kept by a clustered NATS; None: 3 where the
    cluster can place them, else 1, and an existing stream is raised to that, never lowered."""

    results_max_age: float | None = setting("results_max_age")
    results_max_bytes: int | None = setting("results_max_bytes")
    job_ttl: float | None = setting("job_ttl")
    job_history: int | None = setting("job_history")
    replicas: int | None = setting("stream_replicas")

    def __post_init__(self) -> None:
        for flag, seconds in (("--results-max-age", self.results_max_age), ("--job-ttl", self.job_ttl)):
            # JetStream refuses limits this short, and a stream emptied every second keeps nothing
            if seconds is not None and (seconds < 0 or 0 < seconds < 1):
                raise ConfigError(f"{flag} {seconds}: give 0 (no age limit) or at least 1 second")
        if self.results_max_bytes is not None and self.results_max_bytes < 0:
            raise ConfigError(f"--results-max-bytes {self.results_max_bytes}: give 0 (no size limit) or a byte count")
        if self.job_history is not None and not 1 <= self.job_history <= MAX_JOB_HISTORY:
            raise ConfigError(f"--job-history {self.job_history}: must be in 1..{MAX_JOB_HISTORY}")
        if self.replicas is not None and not 1 <= self.replicas <= MAX_REPLICAS:
            raise ConfigError(f"--stream-replicas {self.replicas}: must be in 1..{MAX_REPLICAS}")

    def environment(self) -> dict[str, str]:
        """The variables that give a child process these settings (the ones set)."""
        return {
            env_name: str(getattr(self, name))
            for name, env_name in RETENTION_ENV.items()
            if getattr(self, name) is not None
        }


def retention(ns: argparse.Namespace) -> Retention:
    return from_options(Retention, ns)


@dataclass(frozen=True, slots=True)
class JobSettings:
    """How bulk work is held: a batch not acknowledged within ``ack_wait`` seconds is delivered again
    (holders send in-progress beats every ``ack_wait / 4``); after ``max_deliver`` deliveries it is
    given up as a dead letter. ``retention``: what the stage sets on the streams it meets."""

    ack_wait: float = setting("ack_wait")
    max_deliver: int = setting("max_deliver")
    retention: Retention = Retention()

    def __post_init__(self) -> None:
        if self.ack_wait < 1.0:
            raise ConfigError(f"--ack-wait {self.ack_wait}: must be at least 1 second")
        if self.max_deliver < 1:
            raise ConfigError(f"--max-deliver {self.max_deliver}: must be at least 1")

    @property
    def heartbeat(self) -> float:
        return self.ack_wait / 4


def job_settings(ns: argparse.Namespace) -> JobSettings:
    return from_options(JobSettings, ns, retention=retention(ns))
