"""A job's state as two keys of a real bucket: its record (the submitter's, the gateway's) and its
progress (the stages' counts), one state when read; a record written before the split reads as it was."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import nats
import orjson
import pytest

from embedfleet.shared.jobs.bucket import progress_key, read_state, update_state
from embedfleet.shared.jobs.progress import Rows
from embedfleet.shared.jobs.state import CANCELLED, DONE, RUNNING, JobState, JobStateError
from embedfleet.shared.jobs.status import cancel_job, count_done
from embedfleet.shared.jobs.streams import ensure_streams
from embedfleet.shared.nats.subjects import Subjects


def _submitted(documents: int):
    return lambda s: replace(
        s, status=RUNNING, model="m", input="inline", documents=documents, embedding_type="float32", output="dense"
    )


def _counted(batch: int, rows: int):
    """A worker's count of job batch ``batch``'s ``rows`` rows stored."""
    return lambda s: count_done(s, Rows(batch, 0, rows, rows), 10 * rows)


def test_counts_go_to_the_progress_key_and_the_record_is_left_alone(nats_url):
    async def main() -> None:
        nc = await nats.connect(nats_url)
        try:
            kv = await ensure_streams(nc.jetstream(), Subjects(f"t{uuid.uuid4().hex[:8]}"))
            await update_state(kv, "j", _submitted(4))
            record = await kv.get("j")
            assert (await update_state(kv, "j", _counted(0, 3))).done == 3
            assert (await kv.get("j")).revision == record.revision  # a count writes the progress key only
            progress = orjson.loads((await kv.get(progress_key("j"))).value)
            assert (progress["done"], progress["tokens"], set(progress)) == (
                3,
                30,
                {"job", "done", "tokens", "accounted"},
            )
            state = await update_state(kv, "j", _counted(1, 1))  # the last: settled, by the progress key
            assert (state.status, state.done) == (DONE, 4) and state.finished is not None
            assert (await kv.get("j")).revision == record.revision
            assert orjson.loads((await kv.get("j")).value)["status"] == RUNNING  # the record's own, unread
            assert await read_state(kv, "j") == state  # one state, as written
            assert (await cancel_job(kv, "j")) == state  # done stays done: nothing written
            assert (await kv.get("j")).revision == record.revision

            # a cancel writes the record, and the progress key again as it was (so that a counter that read
            # it before the cancel fails its compare-and-set); a count after it changes nothing
            await update_state(kv, "c", _submitted(4))
            await update_state(kv, "c", _counted(0, 1))
            counts = await kv.get(progress_key("c"))
            assert (await cancel_job(kv, "c")).status == CANCELLED
            fenced = await kv.get(progress_key("c"))
            assert fenced.value == counts.value and fenced.revision > counts.revision
            assert (await update_state(kv, "c", _counted(1, 3))).done == 1
            assert (await kv.get(progress_key("c"))).revision == fenced.revision
            assert (await read_state(kv, "c")).status == CANCELLED

            # a record written before the split: its counts read as they were, then move on in progress
            old = JobState("old", status=RUNNING, model="m", input="inline", documents=5)
            await kv.create("old", replace(old, embedding_type="float32", output="dense", done=2).encode())
            assert (await read_state(kv, "old")).done == 2
            assert (await update_state(kv, "old", _counted(0, 1))).done == 3
            assert orjson.loads((await kv.get(progress_key("old"))).value)["done"] == 3
            assert (await read_state(kv, "old")).done == 3

            # progress holding what only a record may: refused, as a record this code did not write
            await kv.put(progress_key("j"), b'{"job": "j", "owner": "someone"}')
            with pytest.raises(JobStateError, match="its progress holds what only its record may"):
                await read_state(kv, "j")
        finally:
            await nc.close()

    asyncio.run(main())
