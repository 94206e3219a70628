"""A job's state as the job bucket holds it: read into JobState and written back unchanged, the fields'
names as its keys; anything this code does not write refused with the job and the key named; changed
under compare-and-set by functions from the state read to the state written."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import fields, replace

import nats
import pytest

from embedfleet.shared.jobs.bucket import read_state, update_state
from embedfleet.shared.jobs.progress import Ledger
from embedfleet.shared.jobs.state import MAX_DEAD_RECORDS, DeadBatch, JobState, JobStateError, Lease, Run, StoreWait
from embedfleet.shared.jobs.streams import ensure_streams
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.sinks.base import Shape
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking

# every field away from its default, as a chunked job written into a store would have them
FULL = JobState(
    "docs.2026/a=b",
    status="done_with_errors",
    model="all-MiniLM-L6-v2",
    input="inline",
    documents=5,
    batches=2,
    embedding_type="int8",
    output="dense",
    chunking=JobChunking(ChunkSpec(96, 16, "sentence"), late=True, with_text=True),
    request="r" * 64,
    owner="o" * 64,
    published=2,
    started=100.0,
    run=Run(150.5, 1, 0, 30),
    done=4,
    failed=1,
    tokens=400,
    chunks=12,
    chunks_done=10,
    chunks_failed=2,
    errors=("worker: batch 1: engine error",),
    dead=(DeadBatch("worker", 1, 3, 1, 5, "engine error"), DeadBatch("tokenizer", None, 0, 2, 1, "not a job batch")),
    finished=200.0,
    cancelled=190.0,
    collected=4,
    dim=384,
    sink="qdrant://store:6333?collection=c",
    sink_target="qdrant://store:6333?collection=c",
    sink_shape=Shape("int8", "dense", 384, True),
    sink_lease=Lease("gw1", 210.0),
    sink_rows=10,
    sink_error=StoreWait("the store is down", 180.0),
    sink_done=199.0,
    sink_failed="another dimension",
    accounted=Ledger(((0, 1),), {1: ((0, 2), (3, 4))}),
    accounted_chunks=Ledger(((0, 1),), {1: ((0, 4),)}),
    cut=Ledger(((0, 2),), {}),
)


def test_a_state_reads_back_as_it_was_written_its_fields_names_as_keys():
    record = json.loads(FULL.encode())
    assert set(record) == {f.name for f in fields(JobState)}  # FULL sets every field: each is written and read
    assert JobState.decode(FULL.encode(), FULL.job) == FULL
    assert record["run"] == {"started": 150.5, "done": 1, "failed": 0, "tokens": 30}
    assert record["chunking"] == {"size": 96, "overlap": 16, "boundary": "sentence", "late": True, "with_text": True}
    assert record["sink_shape"] == ["int8", "dense", 384, True]
    assert record["sink_lease"] == {"by": "gw1", "until": 210.0}
    assert record["sink_error"] == {"message": "the store is down", "since": 180.0}
    assert record["dead"][1] == {
        "stage": "tokenizer",
        "batch": None,
        "start": 0,
        "documents": 2,
        "deliveries": 1,
        "reason": "not a job batch",
    }
    assert record["accounted"] == {"whole": [[0, 1]], "part": {"1": [[0, 2], [3, 4]]}}


def test_fields_at_their_default_are_not_written():
    assert JobState("j").record() == {"job": "j"}
    assert replace(JobState("j"), done=2, status="running").record() == {"job": "j", "status": "running", "done": 2}
    assert JobState.decode(b'{"job": "j"}', "j") == JobState("j")


def test_a_record_as_a_submitted_and_counted_job_has_it_is_read():
    """The bytes of a job two batches into its run, as the bucket holds them: read field by field."""
    data = (
        b'{"job": "j1", "request": "d1", "run": {"started": 1700000000.5, "done": 0, "failed": 0, "tokens": 0}, '
        b'"model": "m", "input": "inline", "documents": 10, "batches": 2, "embedding_type": "float32", '
        b'"output": "dense", "status": "running", "started": 1700000000.5, "published": 2, '
        b'"accounted": {"whole": [[0, 1]], "part": {"1": [[0, 3]]}}, "done": 8, "tokens": 80, "failed": 0}'
    )
    state = JobState.decode(data, "j1")
    assert (state.status, state.documents, state.done, state.failed, state.tokens, state.published) == (
        "running",
        10,
        8,
        0,
        80,
        2,
    )
    assert state.run == Run(1700000000.5, 0, 0, 0) and state.accounted == Ledger(((0, 1),), {1: ((0, 3),)})
    assert state.submitted and not JobState("j1", done=3).submitted


@pytest.mark.parametrize(
    "data, said",
    [
        (b"\xff\xfe", "its state is not JSON"),
        (b'{"job": "j", "done": 1', "its state is not JSON"),
        (b'["job", "j"]', "a JSON object is expected"),
        (b'{"done": 1}', "'job' must be the job's id 'j', not None"),
        (b'{"job": "other"}', "'job' must be the job's id 'j', not 'other'"),
        (b'{"job": "j", "owner_key": "secret"}', "unknown key 'owner_key'"),
        (b'{"job": "j", "done": "3"}', "'done': a whole number of at least 0 is expected, not '3'"),
        (b'{"job": "j", "done": -1}', "'done': a whole number of at least 0 is expected, not -1"),
        (b'{"job": "j", "failed": true}', "'failed': a whole number"),
        (b'{"job": "j", "tokens": 1.5}', "'tokens': a whole number"),
        (b'{"job": "j", "status": "paused"}', "'status': one of running, done, done_with_errors, cancelled, stalled"),
        (b'{"job": "j", "started": "yesterday"}', "'started': a unix time is expected"),
        (b'{"job": "j", "model": null}', "'model': a string is expected, not None"),
        (b'{"job": "j", "run": {"started": 1.0}}', "'run': an object of started, done, failed, tokens is expected"),
        (b'{"job": "j", "dead": [{"stage": "worker"}]}', "'dead': an object of stage, batch, start"),
        (b'{"job": "j", "dead": {"stage": "worker"}}', "'dead': a list of at most 100 is expected"),
        (b'{"job": "j", "errors": [1]}', "'errors': a string is expected, not 1"),
        (b'{"job": "j", "accounted": {"whole": [[3, 1]], "part": {}}}', "'accounted': ranges [lo, hi) in order"),
        (b'{"job": "j", "cut": {"whole": [[0, 2], [1, 3]], "part": {}}}', "'cut': ranges [lo, hi) in order"),
        (b'{"job": "j", "accounted": {"whole": [], "part": {"-1": []}}}', "'part' must map job batches to ranges"),
        (b'{"job": "j", "accounted": {"whole": [[0, 1, 2]], "part": {}}}', "ranges [lo, hi) are expected"),
        (b'{"job": "j", "accounted": []}', "'accounted': an object of whole, part is expected"),
        (
            b'{"job": "j", "chunking": {"size": 0, "overlap": 0, "boundary": "token", "late": false, "with_text": false}}',
            "'chunking': chunking.size must be an integer of at least 1, got 0",
        ),
        (
            b'{"job": "j", "sink_shape": ["int8", "dense", 384]}',
            "'sink_shape': [form, output, dim, chunked] is expected",
        ),
        (b'{"job": "j", "sink_shape": ["int4", "dense", 384, false]}', "'sink_shape': one of float32"),
        (b'{"job": "j", "embedding_type": "f4"}', "'embedding_type': one of float32"),
        (
            b'{"job": "j", "documents": 3}',
            ("a submission records model, input, documents, embedding_type, output together, not documents alone"),
        ),
    ],
)
def test_a_record_this_code_does_not_write_is_refused_naming_the_job_and_the_key(data, said):
    with pytest.raises(JobStateError) as exc:
        JobState.decode(data, "j")
    assert str(exc.value).startswith("job 'j': its state ") and said in str(exc.value), str(exc.value)


def test_lists_longer_than_this_code_keeps_are_refused():
    errors = json.dumps({"job": "j", "errors": ["x"] * (MAX_DEAD_RECORDS + 1)}).encode()
    with pytest.raises(JobStateError, match="'errors': a list of at most 100"):
        JobState.decode(errors, "j")
    assert (
        len(JobState.decode(json.dumps({"job": "j", "errors": ["x"] * MAX_DEAD_RECORDS}).encode(), "j").errors) == 100
    )


def test_the_bucket_refuses_to_read_or_change_a_bad_record_and_changes_land_under_compare_and_set(nats_url):
    async def main() -> None:
        nc = await nats.connect(nats_url)
        try:
            kv = await ensure_streams(nc.jetstream(), Subjects(f"s{uuid.uuid4().hex[:8]}"))
            await kv.put("bad", b'{"job": "bad", "done": "many"}')  # a client that can write the bucket
            with pytest.raises(JobStateError, match="job 'bad': its state is not one this version writes: 'done'"):
                await read_state(kv, "bad")
            with pytest.raises(JobStateError):
                await update_state(kv, "bad", lambda s: replace(s, done=1))
            assert (await kv.get("bad")).value == b'{"job": "bad", "done": "many"}'  # nothing written over it
            with pytest.raises(TypeError, match="a job state's change gives a JobState, not NoneType"):
                await update_state(kv, "j", lambda s: None)
            assert await read_state(kv, "j") is None

            # 40 writers at once, each adding one: every change lands, retried on a conflict with the state read again
            await asyncio.gather(*(update_state(kv, "j", lambda s: replace(s, done=s.done + 1)) for _ in range(40)))
            assert await read_state(kv, "j") == JobState("j", done=40)
        finally:
            await nc.close()

    asyncio.run(main())
