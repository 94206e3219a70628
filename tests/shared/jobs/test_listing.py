"""Reading every job record in the bucket (shared/jobs/listing.py) on a real nats-server: an empty
bucket is no error, each key's current record once, deleted and purged keys left out, across several
fetches, a bucket past the bound refused before it is read, and the reader's consumer gone after."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import nats
import orjson
import pytest

from embedfleet.shared.jobs import listing as job_listing
from embedfleet.shared.jobs.bucket import update_state
from embedfleet.shared.jobs.listing import Listed, TooManyRecords, bucket_records, listed
from embedfleet.shared.jobs.state import JobState
from embedfleet.shared.jobs.streams import bucket_stream, ensure_streams
from embedfleet.shared.nats.subjects import Subjects
from tests.support.job_states import submitted


async def _all(js, subjects: Subjects, most: int | None = None) -> dict[str, JobState]:
    return {job: JobState.decode(data, job) async for job, data in bucket_records(js, subjects, most)}


def test_every_current_record_once_the_removed_ones_not(nats_url, monkeypatch):
    monkeypatch.setattr(job_listing, "FETCH", 2)  # several fetches for a handful of records

    async def main() -> None:
        nc = await nats.connect(nats_url)
        try:
            js, subjects = nc.jetstream(), Subjects(f"t{uuid.uuid4().hex[:8]}")
            kv = await ensure_streams(js, subjects)
            assert await _all(js, subjects) == {}  # empty: nothing, not an error
            for n in range(7):
                await update_state(kv, f"job-{n}", submitted(n + 1, started=float(n)))
            await update_state(kv, "job-3", lambda s: replace(s, dim=4))  # written again: its last record
            await kv.delete("job-5")
            await kv.purge("job-6")
            states = await _all(js, subjects)
            assert sorted(states) == ["job-0", "job-1", "job-2", "job-3", "job-4"]
            assert states["job-3"].dim == 4 and states["job-2"].documents == 3
            assert (await js.stream_info(bucket_stream(subjects))).state.consumer_count == 0
            with pytest.raises(TooManyRecords, match="holds 7 records, more than the 6 a listing reads"):
                await _all(js, subjects, most=6)  # the deleted and purged keys' markers count
            assert len(await _all(js, subjects, most=7)) == 5
            assert (await js.stream_info(bucket_stream(subjects))).state.consumer_count == 0
            for job in states:
                await kv.delete(job)
            assert await _all(js, subjects) == {}  # every key deleted: markers only
        finally:
            await nc.close()

    asyncio.run(main())


def test_a_record_s_place_and_owner_are_read_without_decoding_it_whole():
    record = JobState("j", status="running", documents=2, started=12.5, owner="digest").encode()
    assert listed(record, "j") == Listed("j", 12.5, "digest", "running")
    assert listed(orjson.dumps({"job": "j", "documents": 1, "started": "soon"}), "j") == Listed("j", 0.0, None, None)
    assert listed(JobState("j", done=3).encode(), "j") is None  # counted, never submitted
    assert listed(b"[1]", "j") is None and listed(b"{", "j") is None
