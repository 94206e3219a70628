"""``embedfleet jobs cancel ID``: stop a bulk job.

Its state says ``cancelled`` with what was done; publishers stop before their next batch, tokenizers
and workers drop its queued batches unprocessed, and the results stored so far stay in the results
stream until the job is purged (``embedfleet jobs purge ID``).
"""

from __future__ import annotations

import sys

from embedfleet.shared.jobs.bucket import has_state_key
from embedfleet.shared.jobs.state import CANCELLED, JobState
from embedfleet.shared.jobs.status import cancel_job
from embedfleet.shared.jobs.streams import job_bucket
from embedfleet.shared.nats.config import NatsConfig
from embedfleet.shared.nats.lifecycle import connect_within


def outcome(state: JobState) -> str:
    """One line on what cancelling left of the job."""
    job = state.job
    chunks = f" ({state.chunks_done} chunks)" if state.chunking is not None else ""
    counts = f"{state.done} of {state.documents} documents stored{chunks}, {state.failed} failed"
    if state.status == CANCELLED:
        return f"job {job} cancelled: {counts}; its stored results stay until purged (embedfleet jobs purge {job})"
    return f"job {job} had already finished ({state.status}): {counts}; nothing to cancel"


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
    print(outcome(state))
    return 0
