"""A job id already in use by a job of another vector form is refused, not resumed into mixed forms."""

import asyncio
from dataclasses import replace

import pytest

from embedfleet.shared.jobs.publish import JobConflict, form_conflict, submit
from embedfleet.shared.jobs.state import JobState
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import EmbedOptions
from tests.support.waiting import eventually


def _job(form: str, output: str = "dense") -> JobState:
    return JobState("j", model="m", input="inline", documents=3, embedding_type=form, output=output)


def test_form_conflict():
    assert form_conflict(None, "int8") is None  # no job yet
    assert form_conflict(JobState("j", done=2), "int8") is None  # a state with no job recorded in it
    assert form_conflict(_job("int8"), "int8") is None
    assert form_conflict(_job("int8"), "binary") == "job j makes int8 vectors, not binary: give it another job id"
    # the output kind counts too: a dense job is not resumed as a sparse one
    assert "makes float32 vectors, not sparse float32" in form_conflict(_job("float32"), "float32", "sparse")
    assert form_conflict(_job("float32", "sparse"), "float32", "sparse") is None


class _Entry:
    def __init__(self, value: bytes, revision: int) -> None:
        self.value, self.revision = value, revision


class _MemoryKV:
    """The two calls update_state makes of a key-value bucket, in memory."""

    def __init__(self) -> None:
        self.data: dict[str, _Entry] = {}

    async def get(self, key: str) -> _Entry:
        from nats.js.errors import KeyNotFoundError

        if key not in self.data:
            raise KeyNotFoundError
        return self.data[key]

    async def create(self, key: str, value: bytes) -> None:
        self.data[key] = _Entry(value, 1)

    async def update(self, key: str, value: bytes, last: int) -> None:
        self.data[key] = _Entry(value, last + 1)


class _RecordingJS:
    def __init__(self) -> None:
        self.published: list[str] = []
        self.claims: dict[str, bytes] = {}  # a job's claim (shared/jobs/claims.py), by subject

    async def publish(self, subject: str, data: bytes, headers: dict | None = None):
        from types import SimpleNamespace

        if headers is None:  # a claim
            self.claims[subject] = data
            return SimpleNamespace(seq=len(self.claims))
        self.published.append(headers["Nats-Msg-Id"])

    async def get_last_msg(self, stream: str, subject: str, direct: bool = False):
        from types import SimpleNamespace

        from nats.js.errors import NotFoundError

        if subject not in self.claims:
            raise NotFoundError
        return SimpleNamespace(data=self.claims[subject], seq=list(self.claims).index(subject) + 1)

    async def stream_info(self, name: str, subjects_filter: str):  # nothing waits for the tokenizers
        from types import SimpleNamespace

        return SimpleNamespace(state=SimpleNamespace(subjects={}))


def test_submit_records_the_form_and_refuses_another():
    import json

    kv, js = _MemoryKV(), _RecordingJS()
    docs = [("a", "one"), ("b", "two"), ("c", "three")]

    async def run(dtype: str) -> JobState:
        return await submit(js, kv, Subjects(), "job1", "m", docs, 2, EmbedOptions(dtype=dtype), "inline")

    state = asyncio.run(run("i1"))
    stored = json.loads(kv.data["job1"].value)  # the record other processes read: the fields' names as keys
    assert JobState.decode(kv.data["job1"].value, "job1") == replace(state, published=2)
    assert {
        k: stored[k]
        for k in ("job", "status", "model", "input", "documents", "batches", "published", "embedding_type", "output")
    } == {
        "job": "job1",
        "status": "running",
        "model": "m",
        "input": "inline",
        "documents": 3,
        "batches": 2,
        "published": 2,
        "embedding_type": "int8",
        "output": "dense",
    }
    assert stored["run"]["started"] == stored["started"] and len(stored["request"]) == 64
    assert js.published == ["job1:0", "job1:1"]
    asyncio.run(run("i1"))  # the same form: resumed, nothing published again
    assert js.published == ["job1:0", "job1:1"]
    with pytest.raises(JobConflict, match="makes int8 vectors, not ubinary"):
        asyncio.run(run("ub1"))
    assert js.published == ["job1:0", "job1:1"]


def test_cancel_stops_submission_before_the_next_batch():
    from embedfleet.shared.jobs.publish import JobCancelled
    from embedfleet.shared.jobs.state import CANCELLED
    from embedfleet.shared.jobs.status import cancel_job

    kv = _MemoryKV()
    docs = [(f"d{i}", "text") for i in range(10)]

    class CancelsAfterTwo(_RecordingJS):
        async def publish(self, subject: str, data: bytes, headers: dict | None = None):
            ack = await super().publish(subject, data, headers)
            if headers is not None and len(self.published) == 2:  # cancelled as the third batch is prepared
                await cancel_job(kv, "job2")
            return ack

    js = CancelsAfterTwo()
    with pytest.raises(JobCancelled, match="after 2 of 5 batches"):
        asyncio.run(submit(js, kv, Subjects(), "job2", "m", docs, 2, EmbedOptions(), "inline"))
    assert js.published == ["job2:0", "job2:1"]
    state = JobState.decode(kv.data["job2"].value, "job2")
    assert state.status == CANCELLED and state.published == 2 and state.cancelled >= state.started
    # submitted again (a rerun of the same command): refused, nothing published
    with pytest.raises(JobCancelled, match="job job2 was cancelled: purge it"):
        asyncio.run(submit(js, kv, Subjects(), "job2", "m", docs, 2, EmbedOptions(), "inline"))
    assert js.published == ["job2:0", "job2:1"]


def test_cancel_job_leaves_unknown_and_finished_jobs_alone():
    import json

    from embedfleet.shared.jobs.bucket import update_state
    from embedfleet.shared.jobs.status import cancel_job

    kv = _MemoryKV()
    assert asyncio.run(cancel_job(kv, "nope")) is None and "nope" not in kv.data  # no state created
    finished = replace(_job("float32"), documents=4, done=4, status="done", finished=1.0)
    asyncio.run(update_state(kv, "fin", lambda s: replace(finished, job=s.job)))
    state = asyncio.run(cancel_job(kv, "fin"))
    assert state.status == "done" and state.cancelled is None
    stored = json.loads(kv.data["fin"].value)
    assert stored["status"] == "done" and "cancelled" not in stored
    running = replace(_job("float32"), documents=9, done=3, status="running")
    asyncio.run(update_state(kv, "run", lambda s: replace(running, job=s.job)))
    state = asyncio.run(cancel_job(kv, "run"))
    assert (state.status, state.done) == ("cancelled", 3) and state.finished == state.cancelled


def test_a_publisher_keeps_a_window_of_its_job_in_the_jobs_stream(nats_url, monkeypatch):
    """On a real nats-server: publishing stops while PUBLISH_AHEAD job batches of the model wait for
    the tokenizers, and goes on as they take them."""
    import uuid

    import nats
    import nats.errors

    import embedfleet.shared.jobs.publish
    from embedfleet.shared.jobs.bucket import read_state
    from embedfleet.shared.jobs.streams import ensure_streams, stream_names

    monkeypatch.setattr(embedfleet.shared.jobs.publish, "PUBLISH_AHEAD", 16)
    subjects = Subjects(f"w{uuid.uuid4().hex[:8]}")

    async def main() -> None:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        try:
            kv = await ensure_streams(js, subjects)
            docs = [(f"d{i}", "text") for i in range(64)]
            publisher = asyncio.create_task(submit(js, kv, subjects, "paced", "m", docs, 1, EmbedOptions(), "inline"))
            stream, subject = stream_names(subjects)["jobs"], subjects.jobs("m")

            async def ahead() -> bool:
                return (await js.stream_info(stream)).state.messages >= 16

            await eventually(ahead, 5, "16 batches published ahead")
            await asyncio.sleep(0.5)  # the sleep is the test: the publisher goes no further meanwhile
            waiting = (await js.stream_info(stream)).state.messages
            assert 16 <= waiting < 16 + 8 and not publisher.done()  # checked every 8 batches
            psub = await js.pull_subscribe(subject, "tokenizers", stream=stream)
            taken, deadline = 0, asyncio.get_running_loop().time() + 30
            while taken < 64 and asyncio.get_running_loop().time() < deadline:
                try:
                    msgs = await psub.fetch(8, timeout=1)
                except (TimeoutError, nats.errors.TimeoutError):
                    continue
                for msg in msgs:
                    await msg.ack()
                    taken += 1
            await asyncio.wait_for(publisher, 10)
            assert taken == 64 and (await read_state(kv, "paced")).published == 64
        finally:
            await nc.close()

    asyncio.run(main())
