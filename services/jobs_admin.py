"""``embedfleet jobs``: every bulk job in the job bucket with its progress, rate and ETA;
``embedfleet jobs purge ID``: a job's results, dead letters and record removed.

Neither creates or changes a stream or the bucket: they read (and purge) what is there.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import NoKeysError, NotFoundError

from shared.config import ConfigError, NatsConfig
from shared.job_ids import job_id_problem
from shared.jobs import (
    DUPLICATE_WINDOW, FINISHED, RUN, SINK, SINK_DONE, SINK_ERROR, SINK_ROWS, job_bucket, job_form, read_state, stream_names,
)
from shared.lifecycle import connect_within

log = logging.getLogger("embedfleet.jobs")

RUNNING = "running"


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


def progress(state: dict, now: float) -> Progress:
    done, failed = state.get("done", 0), state.get("failed", 0)
    run = state.get(RUN) or {}  # where the current run started (jobs recorded before runs were: the job's start)
    started = run.get("started", state.get("started"))
    end = state.get("finished") or now
    seconds = max(end - started, 0.0) if started else 0.0
    embedded = done - run.get("done", 0)
    return Progress(done + failed, state.get("documents", 0), embedded, embedded + failed - run.get("failed", 0),
                    state.get("tokens", 0) - run.get("tokens", 0), seconds, state.get("status") == RUNNING)


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


HEADER = (f"{'job':18} {'status':16} {'documents':>9} {'done':>9} {'failed':>6} {'progress':>8} {'docs/s':>8} "
          f"{'tokens/s':>9} {'eta':>7} {'batches':>7} {'published':>9} {'chunks':>13}  model  form")


def chunks_cell(state: dict) -> str:
    """A chunked job's chunks: stored/cut so far ("-" for a job without chunks)."""
    if not state.get("chunking"):
        return "-"
    return f"{state.get('chunks_done', 0)}/{state.get('chunks', 0)}"


def job_row(key: str, state: dict, now: float) -> str:
    p = progress(state, now)
    share = "-" if p.fraction is None else f"{100 * p.fraction:.1f}%"
    return (f"{key:18} {state.get('status', '?'):16} {p.total:>9} {state.get('done', 0):>9} {state.get('failed', 0):>6} "
            f"{share:>8} {_rate(p.docs_per_s, 1):>8} {_rate(p.tokens_per_s, 0):>9} {duration(p.eta):>7} "
            f"{state.get('batches', 0):>7} {state.get('published', 0):>9} {chunks_cell(state):>13}  "
            f"{state.get('model', '?')}  {job_form(state)}")


def sink_line(state: dict, now: float) -> str | None:
    """Under a job's row, where its rows go when reindex (or the gateway) writes them into a store: the rows written,
    and while the store refuses them, since when and its message (None: no store)."""
    if not state.get(SINK):
        return None
    line = f"  -> {state[SINK]}: {state.get(SINK_ROWS, 0)} rows written"
    if state.get(SINK_DONE):
        line += ", index built"
    if failed := state.get("sink_failed"):  # the gateway's writer (services/gateway/sink_jobs.py) stopped for good
        line += f"; the store refused them for good: {failed}"
    elif error := state.get(SINK_ERROR):
        since = error.get("since") or now
        line += (f"; waiting for the store since {time.strftime('%H:%M:%S', time.localtime(since))} "
                 f"({duration(now - since)}): {error.get('message', '')}")
    return line


async def list_jobs(nats: NatsConfig) -> int:
    nc = await connect_within(nats, "embedfleet-jobs")
    try:
        kv = await job_bucket(nc.jetstream(), nats.subjects)
        try:
            keys = await kv.keys() if kv is not None else []
        except NoKeysError:
            keys = []
        states = {}
        for key in keys:
            assert kv is not None  # the keys are its
            try:
                states[key] = json.loads((await kv.get(key)).value or b"")  # an empty record is no JSON either
            except NotFoundError:
                continue  # expired or purged since it was listed
            except ValueError:
                log.warning("job %s: its record is not JSON: skipped", key)
        now = time.time()
        print(HEADER)
        for key in sorted(states, key=lambda k: (states[k].get("started") or 0, k)):
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
        if state is not None and state.get("status") not in FINISHED and not force:
            p = progress(state, time.time())
            raise ConfigError(f"job {job} is {state.get('status', 'not finished')} ({p.settled}/{p.total} documents): "
                              f"purge it once it is over (`embedfleet jobs cancel {job}` ends it), or now with --force "
                              "(batches still in flight would store results again)")
        names = stream_names(subjects)
        results = await purge_subject(js, names["results"], subjects.results(job))
        await purge_subject(js, names["results"], subjects.sources(job))  # a sink job's rows' fields and texts
        dead = await purge_subject(js, names["dead"], subjects.dead(job))
        if state is not None and kv is not None:  # a state was read from it
            await kv.purge(job)
        if state is None and not results and not dead:
            print(f"no job {job}: nothing to purge")
            return 1
        print(f"job {job}: {results} result messages and {dead} dead letters removed"
              + (f", and its record; the same id can run again in {DUPLICATE_WINDOW:.0f}s (until then the streams "
                 "take its batches for repeats of this run's)" if state is not None else "; it had no record"))
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
