"""Configuration shared by every service, and helpers to read options from CLI and environment.

Every option has a CLI flag and an environment variable (``EMBEDFLEET_*``; the NATS URL also reads
``NATS_URL``). The flag wins over the environment, the environment over the default.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any, Callable

from shared.subjects import Subjects

LOG_LEVELS = ("debug", "info", "warning", "error")


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


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value


@dataclass(frozen=True, slots=True)
class NatsConfig:
    url: str
    subjects: Subjects
    connect_timeout: float = 5.0
    ready_file: str | None = None  # written once the service serves, removed when it stops (probes)

    def __post_init__(self) -> None:
        for url in self.url.split(","):
            if "://" not in url:
                raise ConfigError(f"NATS URL {url!r} must look like nats://host:port")


def add_common_arguments(parser: argparse.ArgumentParser, nats_required: bool = True) -> None:
    nats_default = env("EMBEDFLEET_NATS_URL", env("NATS_URL"))
    parser.add_argument(
        "--nats",
        default=nats_default if nats_default else ("nats://127.0.0.1:4222" if nats_required else None),
        help="NATS server URL(s), comma separated (env EMBEDFLEET_NATS_URL or NATS_URL)"
        + ("" if nats_required else "; none: start an embedded nats-server"),
    )
    add_option(parser, "--subject-prefix", "EMBEDFLEET_SUBJECT_PREFIX", "embedfleet", "NATS subject prefix")
    add_option(parser, "--log-level", "EMBEDFLEET_LOG_LEVEL", "info", "log level", choices=LOG_LEVELS)
    add_option(parser, "--ready-file", "EMBEDFLEET_READY_FILE", None,
               "file written once the service is ready (model loaded and warmed, subscribed) and removed when it "
               "stops: for readiness probes")


def nats_config(ns: argparse.Namespace) -> NatsConfig:
    try:
        subjects = Subjects(ns.subject_prefix)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return NatsConfig(url=ns.nats, subjects=subjects, ready_file=getattr(ns, "ready_file", None))


@dataclass(frozen=True, slots=True)
class JobSettings:
    """How bulk work is held: a batch not acknowledged within ``ack_wait`` seconds is delivered again
    (holders send in-progress beats every ``ack_wait / 4``); after ``max_deliver`` deliveries it is
    given up as a dead letter."""

    ack_wait: float = 60.0
    max_deliver: int = 5

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


def job_settings(ns: argparse.Namespace) -> JobSettings:
    return JobSettings(ack_wait=ns.ack_wait, max_deliver=ns.max_deliver)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(
        parser, "--model", "EMBEDFLEET_MODEL", None,
        "local Hugging Face / sentence-transformers model folder (default: the shipped all-MiniLM-L6-v2)",
    )
    add_option(
        parser, "--model-name", "EMBEDFLEET_MODEL_NAME", None,
        "the id clients use for the model (default: the folder's name)",
    )
