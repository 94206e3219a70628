"""The fabric's one backoff: pauses doubling to a ceiling, each with jitter, and calls tried again only
while their failure is one waiting may cure, and only for as long as they may wait."""

import asyncio

import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import BadRequestError, ServiceUnavailableError

from embedfleet.shared.nats.retry import Backoff, retry_transient, transient


def test_pauses_double_to_the_ceiling_each_between_half_and_all_of_its_step():
    backoff = Backoff(0.5, 4.0)
    steps = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    pauses = [backoff.next() for _ in steps]
    assert all(step / 2 <= pause <= step for pause, step in zip(pauses, steps)), pauses
    assert len({round(p, 6) for p in (Backoff(1, 1).next() for _ in range(20))}) > 1  # jittered


def _failing(errors: list[BaseException]):
    calls = []

    async def call() -> str:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return "done"

    return call, calls


def test_a_transient_failure_is_tried_again_until_the_call_goes_through():
    call, calls = _failing([NatsTimeoutError(), ServiceUnavailableError()])
    assert asyncio.run(retry_transient(call, transient, 5.0, "test", first=0.01, most=0.02)) == "done"
    assert len(calls) == 3


def test_a_refusal_is_raised_at_once_and_a_transient_one_once_patience_is_spent():
    call, calls = _failing([BadRequestError()])
    with pytest.raises(BadRequestError):
        asyncio.run(retry_transient(call, transient, 5.0, "test", first=0.01))
    assert len(calls) == 1
    call, calls = _failing([NatsTimeoutError()] * 1000)
    with pytest.raises(NatsTimeoutError):
        asyncio.run(retry_transient(call, transient, 0.2, "test", first=0.01, most=0.02))
    assert 3 <= len(calls) < 100
