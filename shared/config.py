"""Configuration shared by every service, and helpers to read options from CLI and environment.

Every option has a CLI flag and an environment variable (``EMBEDFLEET_*``; the NATS URL also reads
``NATS_URL``). The flag wins over the environment, the environment over the default. NATS secrets
(password, token) are read from files or environment variables only: a flag would show them in ``ps``.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from shared.nats_auth import NatsAuth, NatsTls, read_secret, redact, split_credentials
from shared.subjects import Subjects

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


class ConfigError(ValueError):
    """A missing or invalid option; the message names the option and the bad value."""


def env(name: str, default: Any = None) -> Any:
    value = os.environ.get(name)
    return default if value is None or value == "" else value


def add_option(
    parser: argparse.ArgumentParser,
    flag: str,
    env_name: str,
    default: Any,
    help: str,
    type: Callable[[str], Any] = str,
    choices: tuple | None = None,
) -> None:
    """Add ``--flag`` whose default comes from ``$env_name``, then ``default``."""
    raw = os.environ.get(env_name)
    if raw:
        try:
            default = type(raw)
        except ValueError:
            raise ConfigError(f"${env_name}={raw!r} is not a valid value for {flag}") from None
        if choices and default not in choices:
            raise ConfigError(f"${env_name}={raw!r}: choose one of {', '.join(map(str, choices))}")
    parser.add_argument(
        flag,
        default=default,
        type=type,
        choices=choices,
        help=f"{help} (env {env_name}; default {default!r})",
    )


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(text)
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError(text)
    return value


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


# Secrets read from the environment only (a flag would show them in ps).
PASSWORD_ENV = "EMBEDFLEET_NATS_PASSWORD"
TOKEN_ENV = "EMBEDFLEET_NATS_TOKEN"
# option -> environment variable, for every NATS credential and TLS option (embedfleet up passes them on)
NATS_SECURITY_ENV = {
    "nats_user": "EMBEDFLEET_NATS_USER",
    "nats_password_file": "EMBEDFLEET_NATS_PASSWORD_FILE",
    "nats_token_file": "EMBEDFLEET_NATS_TOKEN_FILE",
    "nats_nkey_seed": "EMBEDFLEET_NATS_NKEY_SEED",
    "nats_creds": "EMBEDFLEET_NATS_CREDS",
    "nats_tls_ca": "EMBEDFLEET_NATS_TLS_CA",
    "nats_tls_cert": "EMBEDFLEET_NATS_TLS_CERT",
    "nats_tls_key": "EMBEDFLEET_NATS_TLS_KEY",
    "nats_tls_hostname": "EMBEDFLEET_NATS_TLS_HOSTNAME",
}


def add_common_arguments(parser: argparse.ArgumentParser, nats_required: bool = True) -> None:
    nats_default = env("EMBEDFLEET_NATS_URL", env("NATS_URL"))
    parser.add_argument(
        "--nats",
        default=nats_default if nats_default else ("nats://127.0.0.1:4222" if nats_required else None),
        help="NATS server URL(s), comma separated; may carry credentials, nats://USER:PASSWORD@HOST:PORT or "
        "nats://TOKEN@HOST:PORT (env EMBEDFLEET_NATS_URL or NATS_URL)"
        + ("" if nats_required else "; none: start an embedded nats-server"),
    )
    add_nats_security_arguments(parser)
    add_option(parser, "--subject-prefix", "EMBEDFLEET_SUBJECT_PREFIX", "embedfleet", "NATS subject prefix")
    add_option(parser, "--log-level", "EMBEDFLEET_LOG_LEVEL", "info", "log level", choices=LOG_LEVELS)
    add_option(parser, "--log-format", "EMBEDFLEET_LOG_FORMAT", "text",
               "log lines as text, or one JSON object a line for log pipelines", choices=LOG_FORMATS)
    add_option(parser, "--ready-file", "EMBEDFLEET_READY_FILE", None,
               "file written once the service is ready (model loaded and warmed, subscribed) and removed when it "
               "stops: for readiness probes")


_NATS_SECURITY_HELP = {  # option (its dest in NATS_SECURITY_ENV) -> help; none takes a default
    "--nats-user": f"NATS user name; its password from --nats-password-file or {PASSWORD_ENV}",
    "--nats-password-file": f"file holding the NATS password (first line), or {PASSWORD_ENV} holding the password itself",
    "--nats-token-file": f"file holding a NATS auth token (first line), or {TOKEN_ENV} holding the token itself",
    "--nats-nkey-seed": "file holding a NATS user nkey seed (SU..., as nk -gen user writes)",
    "--nats-creds": "NATS credentials file (user JWT and nkey seed, as nsc writes): servers in operator mode",
    "--nats-tls-ca": "CA certificate(s), PEM, to verify the NATS server's certificate with (default: the system's)",
    "--nats-tls-cert": "client certificate, PEM, for mutual TLS with NATS (with --nats-tls-key)",
    "--nats-tls-key": "private key, PEM without a passphrase, of --nats-tls-cert",
    "--nats-tls-hostname": "name the NATS server's certificate must carry (default: the URL's host)",
}


def add_nats_security_arguments(parser: argparse.ArgumentParser) -> None:
    for option, text in _NATS_SECURITY_HELP.items():
        add_option(parser, option, NATS_SECURITY_ENV[option[2:].replace("-", "_")], None, text)


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
        if password is not None and env(PASSWORD_ENV) is not None:
            raise ValueError(f"the NATS password is given twice: --nats-password-file and ${PASSWORD_ENV}")
        if token is not None and env(TOKEN_ENV) is not None:
            raise ValueError(f"the NATS token is given twice: --nats-token-file and ${TOKEN_ENV}")
        password = password if password is not None else env(PASSWORD_ENV)
        token = token if token is not None else env(TOKEN_ENV)
        user = opt["nats_user"]
        if url_user is not None:
            if user is not None or password is not None or token is not None:
                raise ValueError("NATS credentials are given both in the --nats URL and as options: give one")
            user, password, token = (url_user, url_secret, None) if url_secret is not None else (None, None, url_user)
        auth = NatsAuth(user=user, password=password, token=token, nkey_seed=opt["nats_nkey_seed"], creds=opt["nats_creds"])
        auth.check_files()
        tls = NatsTls(ca=opt["nats_tls_ca"], cert=opt["nats_tls_cert"], key=opt["nats_tls_key"],
                      hostname=opt["nats_tls_hostname"])
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


DAY = 24 * 3600.0
RESULTS_MAX_AGE = 7 * DAY  # the results stream's age limit when it is created with none given
JOB_TTL = 30 * DAY  # the job bucket's, as long as dead letters are kept
MAX_JOB_HISTORY = 64  # JetStream's limit on a key-value bucket's revisions per key
# Retention field -> environment variable (embedfleet up hands them to every service it starts)
RETENTION_ENV = {
    "results_max_age": "EMBEDFLEET_RESULTS_MAX_AGE",
    "results_max_bytes": "EMBEDFLEET_RESULTS_MAX_BYTES",
    "job_ttl": "EMBEDFLEET_JOB_TTL",
    "job_history": "EMBEDFLEET_JOB_HISTORY",
    "replicas": "EMBEDFLEET_STREAM_REPLICAS",
}
MAX_REPLICAS = 5  # JetStream's limit on a stream's replicas


@dataclass(frozen=True, slots=True)
class Retention:
    """How long bulk-job output is kept, set on the results stream and the job bucket by whichever
    process creates or meets them: a job's results for ``results_max_age`` seconds, or until the stream
    holds ``results_max_bytes`` (the oldest go first); a job's record for ``job_ttl`` seconds after its
    last change, ``job_history`` revisions of it. 0: no such limit. None: as the stream or bucket has
    it (the module's defaults when it is created), so a process given no retention changes none.
    ``replicas``: copies of every stream and the bucket kept by a clustered NATS; None: 3 where the
    cluster can place them, else 1, and an existing stream is raised to that, never lowered."""

    results_max_age: float | None = None
    results_max_bytes: int | None = None
    job_ttl: float | None = None
    job_history: int | None = None
    replicas: int | None = None

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
        return {env_name: str(getattr(self, name)) for name, env_name in RETENTION_ENV.items()
                if getattr(self, name) is not None}


def add_retention_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--results-max-age", RETENTION_ENV["results_max_age"], None,
               "seconds a job's results are kept in the results stream, 0: no age limit; unset: as the stream has it "
               f"({RESULTS_MAX_AGE:.0f} when created)", non_negative_float)
    add_option(parser, "--results-max-bytes", RETENTION_ENV["results_max_bytes"], None,
               "bytes the results stream may hold, the oldest results dropped first; 0: no size limit; unset: as the "
               "stream has it (0 when created)", non_negative_int)
    add_option(parser, "--job-ttl", RETENTION_ENV["job_ttl"], None,
               "seconds a job's record is kept after its last change, 0: kept; unset: as the bucket has it "
               f"({JOB_TTL:.0f} when created)", non_negative_float)
    add_option(parser, "--job-history", RETENTION_ENV["job_history"], None,
               f"revisions kept of each job's record, 1..{MAX_JOB_HISTORY}; unset: as the bucket has it (1 when created)",
               positive_int)
    add_option(parser, "--stream-replicas", RETENTION_ENV["replicas"], None,
               f"copies a clustered NATS keeps of each job stream and of the job bucket, 1..{MAX_REPLICAS}; unset: 3 "
               "where the cluster can place them, else 1 (an existing stream is raised to that, never lowered)",
               positive_int)


def retention(ns: argparse.Namespace) -> Retention:
    return Retention(results_max_age=ns.results_max_age, results_max_bytes=ns.results_max_bytes, job_ttl=ns.job_ttl,
                     job_history=ns.job_history, replicas=ns.stream_replicas)


@dataclass(frozen=True, slots=True)
class JobSettings:
    """How bulk work is held: a batch not acknowledged within ``ack_wait`` seconds is delivered again
    (holders send in-progress beats every ``ack_wait / 4``); after ``max_deliver`` deliveries it is
    given up as a dead letter. ``retention``: what the stage sets on the streams it meets."""

    ack_wait: float = 60.0
    max_deliver: int = 5
    retention: Retention = Retention()

    def __post_init__(self) -> None:
        if self.ack_wait < 1.0:
            raise ConfigError(f"--ack-wait {self.ack_wait}: must be at least 1 second")
        if self.max_deliver < 1:
            raise ConfigError(f"--max-deliver {self.max_deliver}: must be at least 1")

    @property
    def heartbeat(self) -> float:
        return self.ack_wait / 4


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--ack-wait", "EMBEDFLEET_ACK_WAIT", 60.0,
               "seconds before an unacknowledged bulk batch is delivered again", positive_float)
    add_option(parser, "--max-deliver", "EMBEDFLEET_MAX_DELIVER", 5,
               "deliveries of a bulk batch before it is given up as a dead letter", positive_int)
    add_retention_arguments(parser)


def job_settings(ns: argparse.Namespace) -> JobSettings:
    return JobSettings(ack_wait=ns.ack_wait, max_deliver=ns.max_deliver, retention=retention(ns))


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(
        parser, "--model", "EMBEDFLEET_MODEL", None,
        "local Hugging Face / sentence-transformers model folder (default: the shipped all-MiniLM-L6-v2)",
    )
    add_option(
        parser, "--model-name", "EMBEDFLEET_MODEL_NAME", None,
        "the id clients use for the model (default: the folder's name)",
    )
