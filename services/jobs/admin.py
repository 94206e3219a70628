"""``embedfleet jobs``: every bulk job in the job bucket with its progress, rate and ETA;
``embedfleet jobs purge ID``: a job's results, dead letters and record removed.

Neither creates or changes a stream or the bucket: they read (and purge) what is there.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import NoKeysError, NotFoundError

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.jobs.bucket import has_state_key, purge_state, read_state
from embedfleet.shared.jobs.claims import SUBMITTERS, claim_subject, claims_stream
from embedfleet.shared.jobs.ids import job_id_problem
from embedfleet.shared.jobs.publish import job_form
from embedfleet.shared.jobs.state import FINISHED, RUNNING, JobState, JobStateError
from embedfleet.shared.jobs.streams import DUPLICATE_WINDOW, job_bucket, stream_names
from embedfleet.shared.nats.config import NatsConfig
from embedfleet.shared.nats.lifecycle import connect_within

log = logging.getLogger("embedfleet.jobs")


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a job stands, from its recorded state. Its rates are those of its current run (a resumed
    job's from the resume on) and count only documents embedded, not those given up."""

    settled: int  # documents stored or given up
    total: int  # documents in the job; 0: not recorded yet
    embedded: int  # documents stored in this run
    run_settled: int  # documents stored or given up in this run
    tokens: int  # tokens of the documents stored in this run
    seconds: float  # since this run started, until the job finished (or until now)
    active: bool

    @property
    def fraction(self) -> float | None:
        return min(self.settled / self.total, 1.0) if self.total else None

    @property
    def docs_per_s(self) -> float | None:
        return self.embedded / self.seconds if self.seconds > 0 and self.embedded else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 and self.tokens else None

    @property
    def eta(self) -> float | None:
        """Seconds until every document is settled at this run's pace; None when not running or unknown."""
        if not self.active or not self.total or self.seconds <= 0 or not self.run_settled:
            return None
        return max(self.total - self.settled, 0) / (self.run_settled / self.seconds)


def progress(state: JobState, now: float) -> Progress:
    settled, total = state.done + state.failed, state.documents or 0
    run = state.run  # where the current run started: recorded by every submission
    if run is None:  # counted by a stage, recorded by no submission: no run to rate
        return Progress(settled, total, 0, 0, 0, 0.0, False)
    seconds = max((state.finished or now) - run.started, 0.0)
    embedded = state.done - run.done
    return Progress(
        settled,
        total,
        embedded,
        embedded + state.failed - run.failed,
        state.tokens - run.tokens,
        seconds,
        state.status == RUNNING,
    )


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _rate(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


HEADER = (
    f"{'job':18} {'status':16} {'documents':>9} {'done':>9} {'failed':>6} {'progress':>8} {'docs/s':>8} "
    f"{'tokens/s':>9} {'eta':>7} {'batches':>7} {'published':>9} {'chunks':>13}  model  form"
)


def chunks_cell(state: JobState) -> str:
    """A chunked job's chunks: stored/cut so far ("-" for a job without chunks)."""
    if state.chunking is None:
        return "-"
    return f"{state.chunks_done}/{state.chunks}"


def job_row(key: str, state: JobState, now: float) -> str:
    p = progress(state, now)
    share = "-" if p.fraction is None else f"{100 * p.fraction:.1f}%"
    return (
        f"{key:18} {state.status or '?':16} {p.total:>9} {state.done:>9} {state.failed:>6} "
        f"{share:>8} {_rate(p.docs_per_s, 1):>8} {_rate(p.tokens_per_s, 0):>9} {duration(p.eta):>7} "
        f"{state.batches:>7} {state.published:>9} {chunks_cell(state):>13}  "
        f"{state.model or '?'}  {job_form(state)}"
    )


def sink_line(state: JobState, now: float) -> str | None:
    """Under a job's row, where its rows go when reindex (or the gateway) writes them into a store: the rows written,
    and while the store refuses them, since when and its message (None: no store)."""
    if state.sink is None:
        return None
    line = f"  -> {state.sink}: {state.sink_rows} rows written"
    if state.sink_done is not None:
        line += ", index built"
    if state.sink_failed is not None:  # the gateway's writer (services/gateway/jobs/sinks.py) stopped for good
        line += f"; the store refused them for good: {state.sink_failed}"
    elif (error := state.sink_error) is not None:
        line += (
            f"; waiting for the store since {time.strftime('%H:%M:%S', time.localtime(error.since))} "
            f"({duration(now - error.since)}): {error.message}"
        )
    return line


async def list_jobs(nats: NatsConfig) -> int:
    nc = await connect_within(nats, "embedfleet-jobs")
    try:
        kv = await job_bucket(nc.jetstream(), nats.subjects)
        try:
            keys = await kv.keys() if kv is not None else []
        except NoKeysError:
            keys = []
        states: dict[str, JobState] = {}
        for key in keys:
            assert kv is not None  # the keys are its
            if not has_state_key(key):  # a job's progress key: read with its record
                continue
            try:
                state = await read_state(kv, key)
            except JobStateError as exc:
                log.warning("%s: skipped", exc)
                continue
            if state is not None:  # else expired or purged since it was listed
                states[key] = state
        now = time.time()
        print(HEADER)
        for key in sorted(states, key=lambda k: (states[k].started or 0, k)):
            print(job_row(key, states[key], now))
            if (line := sink_line(states[key], now)) is not None:
                print(line)
        return 0
    finally:
        await nc.close()


async def purge_job(nats: NatsConfig, job: str, force: bool = False) -> int:
    """Remove a job's results, dead letters and record; a job not finished (its batches may still be
    in flight) only with ``force``."""
    if (problem := job_id_problem(job)) is not None:
        raise ConfigError(problem)
    subjects = nats.subjects
    nc = await connect_within(nats, "embedfleet-jobs")
    try:
        js = nc.jetstream()
        kv = await job_bucket(js, subjects)
        state = await read_state(kv, job) if kv is not None else None
        if state is not None and state.status not in FINISHED and not force:
            p = progress(state, time.time())
            raise ConfigError(
                f"job {job} is {state.status or 'not finished'} ({p.settled}/{p.total} documents): "
                f"purge it once it is over (`embedfleet jobs cancel {job}` ends it), or now with --force "
                "(batches still in flight would store results again)"
            )
        names = stream_names(subjects)
        results = await purge_subject(js, names["results"], subjects.results(job))
        await purge_subject(js, names["results"], subjects.sources(job))  # a sink job's rows' fields and texts
        dead = await purge_subject(js, names["dead"], subjects.dead(job))
        for submitter in SUBMITTERS:  # the id may name a new job, claimed afresh
            await purge_subject(js, claims_stream(subjects), claim_subject(subjects, submitter, job))
        if state is not None and kv is not None:  # a state was read from it
            await purge_state(kv, job)
        if state is None and not results and not dead:
            print(f"no job {job}: nothing to purge")
            return 1
        print(
            f"job {job}: {results} result messages and {dead} dead letters removed"
            + (
                f", and its record; the same id can run again in {DUPLICATE_WINDOW:.0f}s (until then the streams "
                "take its batches for repeats of this run's)"
                if state is not None
                else "; it had no record"
            )
        )
        return 0
    finally:
        await nc.close()


async def purge_subject(js: JetStreamContext, stream: str, subject: str) -> int:
    """Remove every message of ``subject`` from ``stream``; returns how many there were."""
    try:
        info = await js.stream_info(stream, subjects_filter=subject)
    except NotFoundError:
        return 0
    count = (info.state.subjects or {}).get(subject, 0)
    if count:
        await js.purge_stream(stream, subject=subject)
    return count
