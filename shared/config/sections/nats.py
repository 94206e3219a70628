"""Options of every command that meets NATS: the server, credentials and TLS, subject prefix, logs, ready file."""

from __future__ import annotations

from embedfleet.shared.config.commands import CONNECTED
from embedfleet.shared.config.option import Option, declare

PASSWORD_ENV = "EMBEDFLEET_NATS_PASSWORD"
TOKEN_ENV = "EMBEDFLEET_NATS_TOKEN"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
_NATS_HELP = (
    "NATS server URL(s), comma separated; may carry credentials, nats://USER:PASSWORD@HOST:PORT or "
    "nats://TOKEN@HOST:PORT"
)

OPTIONS: tuple[Option, ...] = (
    declare(
        "--nats",
        ("EMBEDFLEET_NATS_URL", "NATS_URL"),
        None,
        f"{_NATS_HELP}; none (and no NATS credential given): the stack `embedfleet up` recorded in the --data-dir "
        "given, else in $EMBEDFLEET_DATA_DIR or .embedfleet (the first that has one), else nats://127.0.0.1:4222 (tried for a few "
        "seconds); given: tried until it answers",
        CONNECTED - {"up"},
        "nats",
        shows_value=False,
    ),
    declare(
        "--nats",
        ("EMBEDFLEET_NATS_URL", "NATS_URL"),
        None,
        f"{_NATS_HELP}; none: start an embedded nats-server",
        {"up"},
        "nats",
        shows_value=False,
    ),
    declare(
        "--nats-user",
        "EMBEDFLEET_NATS_USER",
        None,
        f"NATS user name; its password from --nats-password-file or {PASSWORD_ENV}",
        CONNECTED,
        "nats",
    ),
    declare(
        "--nats-password-file",
        "EMBEDFLEET_NATS_PASSWORD_FILE",
        None,
        f"file holding the NATS password (first line), or {PASSWORD_ENV} holding the password itself",
        CONNECTED,
        "nats",
    ),
    declare(
        "nats_password",
        PASSWORD_ENV,
        None,
        "the NATS password itself (with --nats-user)",
        CONNECTED,
        "nats",
        kind="secret",
    ),
    declare(
        "--nats-token-file",
        "EMBEDFLEET_NATS_TOKEN_FILE",
        None,
        f"file holding a NATS auth token (first line), or {TOKEN_ENV} holding the token itself",
        CONNECTED,
        "nats",
    ),
    declare("nats_token", TOKEN_ENV, None, "a NATS auth token itself", CONNECTED, "nats", kind="secret"),
    declare(
        "--nats-nkey-seed",
        "EMBEDFLEET_NATS_NKEY_SEED",
        None,
        "file holding a NATS user nkey seed (SU..., as nk -gen user writes)",
        CONNECTED,
        "nats",
    ),
    declare(
        "--nats-creds",
        "EMBEDFLEET_NATS_CREDS",
        None,
        "NATS credentials file (user JWT and nkey seed, as nsc writes): servers in operator mode",
        CONNECTED,
        "nats",
    ),
    declare(
        "--nats-tls-ca",
        "EMBEDFLEET_NATS_TLS_CA",
        None,
        "CA certificate(s), PEM, to verify the NATS server's certificate with (default: the system's)",
        CONNECTED,
        "nats",
    ),
    declare(
        "--nats-tls-cert",
        "EMBEDFLEET_NATS_TLS_CERT",
        None,
        "client certificate, PEM, for mutual TLS with NATS (with --nats-tls-key)",
        CONNECTED,
        "nats",
    ),
    declare(
        "--nats-tls-key",
        "EMBEDFLEET_NATS_TLS_KEY",
        None,
        "private key, PEM without a passphrase, of --nats-tls-cert",
        CONNECTED,
        "nats",
    ),
    declare(
        "--nats-tls-hostname",
        "EMBEDFLEET_NATS_TLS_HOSTNAME",
        None,
        "name the NATS server's certificate must carry (default: the URL's host)",
        CONNECTED,
        "nats",
    ),
    declare(
        "--subject-prefix",
        "EMBEDFLEET_SUBJECT_PREFIX",
        "embedfleet",
        "NATS subject prefix",
        CONNECTED | {"auth"},
        "common",
    ),
    declare("--log-level", "EMBEDFLEET_LOG_LEVEL", "info", "log level", CONNECTED, "common", choices=LOG_LEVELS),
    declare(
        "--log-format",
        "EMBEDFLEET_LOG_FORMAT",
        "text",
        "log lines as text, or one JSON object a line for log pipelines",
        CONNECTED,
        "common",
        choices=LOG_FORMATS,
    ),
    declare(
        "--ready-file",
        "EMBEDFLEET_READY_FILE",
        None,
        "file written once the service is ready (model loaded and warmed, subscribed) and removed when it stops: "
        "for readiness probes",
        CONNECTED,
        "common",
    ),
)
