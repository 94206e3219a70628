"""How bulk work is held and kept, built from the options of bulk work: ``Retention`` (how long a job's
output and record are kept, set on the streams and the bucket) and ``JobSettings`` (how long a batch may
be held, how often it is delivered), as every stage that meets jobs takes them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.config.registry import from_options, option, setting
from embedfleet.shared.config.sections.bulk import MAX_JOB_HISTORY, MAX_REPLICAS

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
