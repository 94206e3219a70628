"""``embedfleet jobs cancel ID``: stop a bulk job.

Its state says ``cancelled`` with what was done; publishers stop before their next batch, tokenizers
and workers drop its queued batches unprocessed, and the results stored so far stay in the results
stream until the job is purged (``embedfleet jobs purge ID``).
"""

from __future__ import annotations

import sys

from shared.config import NatsConfig
from shared.job_streams import job_bucket
from shared.jobs import CANCELLED, cancel_job, has_state_key
from shared.lifecycle import connect_within


def outcome(job: str, state: dict) -> str:
    """One line on what cancelling left of ``job``."""
    chunks = f" ({state.get('chunks_done', 0)} chunks)" if state.get("chunking") else ""
    counts = (f"{state.get('done', 0)} of {state.get('documents', 0)} documents stored{chunks}, "
              f"{state.get('failed', 0)} failed")
    if state.get("status") == CANCELLED:
        return f"job {job} cancelled: {counts}; its stored results stay until purged (embedfleet jobs purge {job})"
    return f"job {job} had already finished ({state.get('status')}): {counts}; nothing to cancel"


async def cancel(nats: NatsConfig, job: str) -> int:
    """0 when the job is cancelled (or had finished), 1 when there is no such job."""
    if not has_state_key(job):
        print(f"embedfleet: no job {job[:100]!r}", file=sys.stderr)
        return 1
    nc = await connect_within(nats, "embedfleet-jobs")
    try:
        kv = await job_bucket(nc.jetstream(), nats.subjects)  # none yet: no job either
        state = None if kv is None else await cancel_job(kv, job)
    finally:
        await nc.close()
    if state is None:
        print(f"embedfleet: no job {job!r}", file=sys.stderr)
        return 1
    print(outcome(job, state))
    return 0
