"""Holding bulk work on a real nats-server: in-progress beats, dead letters, max-deliveries advisories."""

from __future__ import annotations

import asyncio
import uuid

import nats
import pytest

from embedfleet.shared.jobs.bucket import read_state, update_state
from embedfleet.shared.jobs.settings import JobSettings
from embedfleet.shared.jobs.state import DeadBatch
from embedfleet.shared.jobs.streams import ensure_streams, stream_names
from embedfleet.shared.jobs.work_queue import BatchInfo, DeadLetters, Heartbeats, job_from_msg_id, open_work
from embedfleet.shared.nats.subjects import Subjects
from tests.support.job_states import submitted
from tests.support.waiting import eventually


async def _setup(url: str):
    nc = await nats.connect(url)
    js = nc.jetstream()
    subjects = Subjects(f"t{uuid.uuid4().hex[:8]}")
    kv = await ensure_streams(js, subjects)
    return nc, js, kv, subjects


async def _fetch(psub, wait: float) -> list:
    """Up to one message, waiting at most ``wait`` seconds for it."""
    try:
        return await psub.fetch(1, timeout=wait)
    except (TimeoutError, nats.errors.TimeoutError):
        return []


@pytest.mark.slow  # waits out ack waits
@pytest.mark.parametrize("beats", [True, False])
def test_in_progress_beats_keep_a_held_batch_from_redelivery(nats_url, beats):
    async def main() -> None:
        nc, js, _kv, subjects = await _setup(nats_url)
        try:
            settings = JobSettings(ack_wait=1.0, max_deliver=5)
            subject = subjects.bulk("m")
            psub = await open_work(js, stream_names(subjects)["bulk"], "w", subject, settings)
            await js.publish(subject, b"work", headers={"Nats-Msg-Id": "j:0:0"})
            (msg,) = await _fetch(psub, 2)
            held = Heartbeats(settings.heartbeat)
            if beats:
                held.hold(msg)
            again = await _fetch(psub, 3 * settings.ack_wait)  # three times the ack wait
            await held.stop()
            if beats:
                assert again == [], "a batch with in-progress beats was delivered again"
                assert held.release(msg) and not held.release(msg)
                await msg.ack()
            else:  # the control: without beats the server gives the batch to someone else
                assert len(again) == 1 and again[0].metadata.num_delivered == 2
                await again[0].ack()
        finally:
            await nc.close()

    asyncio.run(main())


def test_give_up_records_a_dead_letter_and_counts_the_documents_once(nats_url):
    async def main() -> None:
        nc, js, kv, subjects = await _setup(nats_url)
        try:
            await update_state(kv, "job1", submitted(10, done=6, status="running"))
            subject = subjects.jobs("m")
            psub = await open_work(js, stream_names(subjects)["jobs"], "t", subject, JobSettings())
            await js.publish(subject, b"\xc1 not msgpack", headers={"Nats-Msg-Id": "job1:3"})
            (msg,) = await _fetch(psub, 2)
            dead = DeadLetters(nc, js, kv, subjects, "tokenizer")
            info = job_from_msg_id(msg.headers, 1)
            assert info == BatchInfo("job1", 3, 0)
            info = BatchInfo("job1", 3, 0, 4)
            await dead.give_up(msg, "not a job batch", info)
            # the same batch recorded again (a crash between record and term): counted once
            await dead.record(msg.data, msg.headers, msg.subject, "again", info, 2)

            state = await read_state(kv, "job1")
            assert state.failed == 4 and state.status == "done_with_errors" and state.finished is not None
            assert state.dead == (DeadBatch("tokenizer", 3, 0, 4, 1, "not a job batch"),)
            assert "not a job batch" in state.errors[0]
            letter = await js.get_last_msg(stream_names(subjects)["dead"], subjects.dead("job1"))
            assert letter.data == b"\xc1 not msgpack"
            assert (
                letter.headers["Embedfleet-Stage"] == "tokenizer"
                and letter.headers["Embedfleet-Reason"] == "not a job batch"
            )
            assert letter.headers["Embedfleet-Origin"] == subject
            assert await _fetch(psub, 1) == []  # terminated: never delivered again
        finally:
            await nc.close()

    asyncio.run(main())


@pytest.mark.slow  # waits out ack waits
def test_max_deliveries_advisory_turns_a_batch_into_a_dead_letter(nats_url):
    """A batch whose holders die before acknowledging it is given up by the server; the watcher
    records it and takes it out of the work queue."""

    async def main() -> None:
        nc, js, kv, subjects = await _setup(nats_url)
        try:
            await update_state(kv, "job2", submitted(3, status="running"))
            stream = stream_names(subjects)["bulk"]
            subject = subjects.bulk("m")
            psub = await open_work(js, stream, "w", subject, JobSettings(ack_wait=1.0, max_deliver=2))
            dead = DeadLetters(nc, js, kv, subjects, "worker")
            await dead.watch(stream, "w", lambda data, headers: BatchInfo("job2", 0, 0, 3))
            await js.publish(subject, b"crashes its holder", headers={"Nats-Msg-Id": "job2:0:0"})
            for delivery in (1, 2):  # taken and never acknowledged, twice
                (msg,) = await _fetch(psub, 3)
                assert msg.metadata.num_delivered == delivery
            for _ in range(20):  # the fleet keeps asking for work: the server finds the batch exhausted
                assert await _fetch(psub, 0.5) == []
                state = await read_state(kv, "job2")
                if state.failed:
                    break
            assert state.failed == 3 and state.status == "done_with_errors", state
            assert state.dead[0].deliveries == 2 and "too many times" in state.dead[0].reason
            letter = await js.get_last_msg(stream_names(subjects)["dead"], subjects.dead("job2"))
            assert letter.data == b"crashes its holder"

            async def removed() -> bool:
                return (await js.stream_info(stream)).state.messages == 0

            await eventually(removed, 5, "the batch removed from the work queue")
            await dead.stop()
        finally:
            await nc.close()

    asyncio.run(main())


def test_message_ids_name_the_job():
    assert job_from_msg_id({"Nats-Msg-Id": "a:b:7:12"}, 2) == BatchInfo("a:b", 7, 12)
    assert job_from_msg_id({"Nats-Msg-Id": "job:5"}, 1) == BatchInfo("job", 5, 0)
    assert job_from_msg_id({"Nats-Msg-Id": "job:x"}, 1) == BatchInfo(None)
    assert job_from_msg_id({}, 2) == BatchInfo(None)


def test_undecodable_batches_still_name_their_job_and_documents():
    import msgpack

    from embedfleet.shared.jobs.work_queue import undecodable

    data = msgpack.packb({"v": 1, "t": "job", "id": 7, "di": ["a", "b"], "x": [1, 2]})
    assert undecodable(data, {"Nats-Msg-Id": "j:3"}, 1) == BatchInfo("j", 3, 0, 2)
    assert undecodable(b"\xc1\xc1", {"Nats-Msg-Id": "j:3:8"}, 2) == BatchInfo("j", 3, 8, 0)


def test_job_settings_are_checked():
    from embedfleet.shared.config.option import ConfigError

    assert JobSettings(ack_wait=8).heartbeat == 2
    with pytest.raises(ConfigError, match="--ack-wait"):
        JobSettings(ack_wait=0.1)


def test_only_valid_kv_keys_name_a_job_state():
    """A forged job id (from an untrusted bulk message) must not reach the KV bucket: the server would
    refuse the key on every try."""
    from embedfleet.shared.jobs.bucket import MAX_JOB_ID, has_state_key

    assert has_state_key("job-1_a=b/c.d")
    assert has_state_key("j" * MAX_JOB_ID)
    for bad in ("", "-*Øs", "a b", ".start", "end.", "a..b", "x>", "x*", "j" * (MAX_JOB_ID + 1)):
        assert not has_state_key(bad), bad


def test_cancellations_are_read_from_the_job_state_and_held(nats_url):
    from embedfleet.shared.jobs.status import cancel_job
    from embedfleet.shared.jobs.work_queue import Cancellations

    async def main() -> None:
        nc, _js, kv, _subjects = await _setup(nats_url)
        try:
            await update_state(kv, "run", submitted(5, status="running"))
            seen = Cancellations(kv, ttl=0.3, hold=0.6)
            assert not await seen.cancelled("run")
            await cancel_job(kv, "run")
            assert not await seen.cancelled("run")  # read less than ttl ago: not read again yet
            await asyncio.sleep(0.35)  # the sleep is the test: the ttl passes
            assert await seen.cancelled("run")
            await kv.delete("run")  # purged
            assert await seen.cancelled("run")  # held: the job's queued batches are dropped without reads
            await asyncio.sleep(0.7)  # the sleep is the test: the hold passes
            assert not await seen.cancelled("run")  # read again after the hold: the id names no cancelled job
            assert not await seen.cancelled("unknown") and not await seen.cancelled("not a key")
        finally:
            await nc.close()

    asyncio.run(main())


def test_a_batch_delivered_after_the_last_fetch_is_handed_back_at_once(nats_url):
    """A pull request left open (a fetch given up as the batch arrived) delivers the batch to a stage
    that stopped fetching: handed back, another stage gets it now, not after ack_wait (60 s)."""
    from embedfleet.shared.jobs.work_queue import hand_back_pending

    async def main() -> None:
        nc, js, _kv, subjects = await _setup(nats_url)
        try:
            stream, subject = stream_names(subjects)["bulk"], subjects.bulk("m")
            stopping = await open_work(js, stream, "w", subject, JobSettings())
            fetching = asyncio.create_task(stopping.fetch(1, timeout=5))

            async def at_server() -> bool:
                return bool((await js.consumer_info(stream, "w")).num_waiting)

            await eventually(at_server, 5, "the pull request at the server")
            fetching.cancel()
            await js.publish(subject, b"late", headers={"Nats-Msg-Id": "j:0:0"})
            await eventually(lambda: stopping.pending_msgs > 0, 5, "the late batch delivered")
            assert stopping.pending_msgs == 1
            assert await hand_back_pending(stopping) == 1 and stopping.pending_msgs == 0
            other = await open_work(js, stream, "w", subject, JobSettings())
            (msg,) = await _fetch(other, 3)
            assert msg.data == b"late" and msg.metadata.num_delivered == 2
            await msg.ack()
        finally:
            await nc.close()

    asyncio.run(main())


def test_a_work_queue_makes_its_lost_consumer_again_and_takes_work_through_it(nats_url):
    """The server lost the stage's durable consumer (deleted, or kept on a node that is gone): the
    stage's work queue finds out, makes it again and binds to it, and the batches waiting are taken."""
    from embedfleet.shared.jobs.work_queue import WorkQueue

    async def main() -> None:
        nc, js, _kv, subjects = await _setup(nats_url)
        try:
            stream, subject = stream_names(subjects)["bulk"], subjects.bulk("m")
            work = WorkQueue(js, stream, "w", subject, JobSettings(), check_every=2)
            await work.open()
            await js.delete_consumer(stream, "w")
            await js.publish(subject, b"waiting", headers={"Nats-Msg-Id": "j:0:0"})
            got = []
            for _ in range(40):
                got = await work.fetch()
                if got:
                    break
            assert [m.data for m in got] == [b"waiting"]
            await got[0].ack()
            assert (await js.consumer_info(stream, "w")).config.filter_subject == subject
            await work.close()
        finally:
            await nc.close()

    asyncio.run(main())


def test_an_idle_work_queue_takes_a_batch_as_it_is_published(nats_url):
    """A stage's fetch waits seconds at the server while nothing comes (an idle stage asks rarely), yet a
    batch published meanwhile is taken at once, not when the wait ends."""
    import time

    from embedfleet.shared.jobs.work_queue import FETCH_WAIT, WorkQueue

    async def main() -> float:
        nc, js, _kv, subjects = await _setup(nats_url)
        try:
            stream, subject = stream_names(subjects)["bulk"], subjects.bulk("m")
            work = WorkQueue(js, stream, "w", subject, JobSettings())
            await work.open()
            fetching = asyncio.create_task(work.fetch())

            async def at_server() -> bool:
                return bool((await js.consumer_info(stream, "w")).num_waiting)

            await eventually(at_server, 5, "the pull request at the server")
            await asyncio.sleep(1.0)  # the stage has been idle a while
            published = time.monotonic()
            await js.publish(subject, b"first", headers={"Nats-Msg-Id": "j:0:0"})
            got = await fetching
            took = time.monotonic() - published
            assert [m.data for m in got] == [b"first"]
            await got[0].ack()
            await work.close()
            return took
        finally:
            await nc.close()

    assert FETCH_WAIT >= 5.0  # idle stages ask the server at most every few seconds
    took = asyncio.run(main())
    assert took < 1.0, took


def test_stop_fetching_ends_the_wait_at_once_and_a_late_batch_is_handed_back(nats_url):
    """A stopping stage does not wait out its fetch; a batch its pull request brings after that is handed
    back for another stage at once."""
    import time

    from embedfleet.shared.jobs.work_queue import WorkQueue

    async def main() -> None:
        nc, js, _kv, subjects = await _setup(nats_url)
        try:
            stream, subject = stream_names(subjects)["bulk"], subjects.bulk("m")
            work = WorkQueue(js, stream, "w", subject, JobSettings(), wait=30.0)
            await work.open()
            fetching = asyncio.create_task(work.fetch())

            async def at_server() -> bool:
                return bool((await js.consumer_info(stream, "w")).num_waiting)

            await eventually(at_server, 5, "the pull request at the server")
            stopped = time.monotonic()
            work.stop_fetching()
            assert await fetching == []
            assert time.monotonic() - stopped < 0.5
            assert await work.fetch() == []  # stopped: no new fetch waits
            await js.publish(subject, b"late", headers={"Nats-Msg-Id": "j:0:0"})
            await eventually(lambda: work.psub.pending_msgs > 0, 5, "the late batch delivered")
            assert await work.hand_back_pending() == 1
            other = await open_work(js, stream, "w", subject, JobSettings())
            (msg,) = await _fetch(other, 3)
            assert msg.data == b"late" and msg.metadata.num_delivered == 2
            await msg.ack()
            await work.close()
        finally:
            await nc.close()

    asyncio.run(main())
