"""A bulk job's tokens against its key's --key-tokens-per-minute: admitted on an estimate from its
characters (refused 413 past a minute's worth, 429 with the wait while the bucket lacks it), then charged
what its state counts as it runs, the estimate's excess given back once it ends (a real NATS key-value
bucket holds the states; the buckets run on a clock the test moves)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import nats
import pytest

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.http.limits import KeyLimits, bind_key, estimated_tokens
from embedfleet.services.gateway.jobs.tokens import JobTokens
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.jobs.state import DONE, RUNNING, JobState
from embedfleet.shared.nats.server import EmbeddedNats


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _level(limits: KeyLimits, key: str) -> float:
    return limits._bucket(key, "tokens", limits.tokens, limits._clock()).level


def test_a_job_is_estimated_from_its_characters():
    assert estimated_tokens(["abcd", "abcde", ""]) == (1 + 2) + (2 + 2) + (0 + 2)


def test_reserve_takes_a_job_s_estimate_at_once_or_says_when_it_fits():
    clock = Clock()
    limits = KeyLimits(tokens=600, clock=clock)
    assert limits.reserve("a", 500) is None and _level(limits, "a") == 100
    assert limits.reserve("a", 400) == 30  # 300 more at 10 a second
    assert _level(limits, "a") == 100  # nothing taken by a refusal
    clock.now += 30
    assert limits.reserve("a", 400) is None
    limits.refund("a", 10_000)  # given back: never past a minute's worth
    assert _level(limits, "a") == 600


def test_admission_refuses_a_job_past_a_minute_s_worth_and_waits_for_one_that_fits_later():
    clock = Clock()
    tokens = JobTokens(None, KeyLimits(tokens=100, clock=clock))
    bind_key(None)
    assert tokens.admit(["x" * 10_000]) is None  # no key: no limit (a gateway without keys)
    bind_key("key-l")
    with pytest.raises(ApiError) as refused:
        tokens.admit(["a sentence of forty characters or so, ok"] * 200)
    assert (refused.value.code, refused.value.status, refused.value.param) == (
        ErrorCode.PAYLOAD_TOO_LARGE,
        413,
        "documents",
    )
    assert refused.value.message.startswith("this job's 200 documents make some 2400 tokens")
    assert tokens.admit(["x" * 240]) == ("key-l", 62)
    with pytest.raises(ApiError) as later:
        tokens.admit(["x" * 240])
    assert (later.value.status, later.value.retry_after) == (429, 15)  # 24 more at 100 a minute
    response = later.value.response("/v1/jobs")
    assert response.status_code == 429 and response.headers["retry-after"] == "15"
    tokens.cancel(("key-l", 62))  # a job not submitted after all: its estimate back
    assert tokens.admit(["x" * 240]) == ("key-l", 62)
    assert JobTokens(None, KeyLimits()).admit(["x" * 10_000]) == ("key-l", 0)  # no limit: followed, not taken


async def _follow(tmp_path) -> tuple[list[float], list[tuple[str, int]]]:
    """A job's state written as it runs, its key's level read after each step; the tokens counted."""
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    nc = await nats.connect(server.url)
    try:
        kv = await nc.jetstream().create_key_value(bucket="jobs_test")
        clock = Clock()
        limits = KeyLimits(tokens=1000, clock=clock)
        usage: list[tuple[str, int]] = []
        tokens = JobTokens(kv, limits, lambda key, n: usage.append((key, n)), every=0.05)
        bind_key("key-a")
        taken = tokens.admit(["x" * 398])  # 100 + 2 tokens estimated
        assert taken == ("key-a", 102)
        state = JobState("j", RUNNING, "m", "inline", documents=1, batches=1, embedding_type="float32", output="dense")
        await kv.put("j", state.encode())
        tokens.watch("j", taken)
        levels = []
        for counted, status in ((50, RUNNING), (150, RUNNING), (150, DONE)):
            await kv.put("j", replace(state, tokens=counted, status=status).encode())
            await asyncio.sleep(0.3)
            levels.append(_level(limits, "key-a"))
        # a job whose count stays under its estimate: the rest given back once it ends
        second = tokens.admit(["x" * 398])
        await kv.put("k", replace(state, job="k", tokens=80, status=DONE).encode())
        tokens.watch("k", second)
        await asyncio.sleep(0.3)
        levels.append(_level(limits, "key-a"))
        await tokens.stop()
        return levels, usage
    finally:
        await nc.close()
        server.stop()


def test_a_running_job_is_charged_what_its_state_counts(tmp_path):
    levels, counted = asyncio.run(_follow(tmp_path))
    assert counted == [("key-a", 50), ("key-a", 100), ("key-a", 80)]  # to the key's usage, as counted
    assert levels == [
        1000 - 102,  # counted 50: within the estimate
        1000 - 150,  # counted past it: the excess charged
        1000 - 150,  # done at 150: nothing to give back
        1000 - 150 - 80,  # the second: 102 taken, 80 counted, 22 back
    ]
