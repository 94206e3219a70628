"""Requests queued together are handled as one group; a lone one at once; nothing is lost on stop."""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg

from embedfleet.services.tokenizer import coalesce
from embedfleet.services.tokenizer.coalesce import Coalescer


def _msg(n: int, size: int = 1) -> Msg:
    return Msg(_client=None, subject="s", data=bytes([n % 256]) * size)


def _numbers(group: list[Msg]) -> list[int]:
    return [m.data[0] for m in group]


async def _collecting(handle_delay: float = 0.0) -> tuple[Coalescer, list[list[int]]]:
    groups: list[list[int]] = []

    async def handle(group: list[Msg]) -> None:
        groups.append(_numbers(group))
        await asyncio.sleep(handle_delay)

    coalescer = Coalescer(handle)
    coalescer.start()
    return coalescer, groups


def test_what_is_queued_together_goes_as_one_group_in_order():
    async def main() -> list[list[int]]:
        coalescer, groups = await _collecting()
        for n in range(5):  # as nats-py hands them over: no yield between the callbacks
            await coalescer.put(_msg(n))
        await coalescer.stop()
        return groups

    assert asyncio.run(main()) == [[0, 1, 2, 3, 4]]


def test_a_lone_message_is_handled_at_once_and_later_ones_form_the_next_group():
    async def main() -> list[list[int]]:
        coalescer, groups = await _collecting(handle_delay=0.05)
        await coalescer.put(_msg(0))
        for _ in range(100):  # handled within a few loop turns: no timer holds it back
            if groups:
                break
            await asyncio.sleep(0)
        assert groups == [[0]]
        for n in (1, 2, 3):  # arrive while the first group is being handled
            await coalescer.put(_msg(n))
        await coalescer.stop()
        return groups

    assert asyncio.run(main()) == [[0], [1, 2, 3]]


def test_a_full_queue_makes_the_callback_wait_for_the_group_to_be_taken():
    async def main() -> tuple[list[list[int]], list[int]]:
        coalescer, groups = await _collecting()
        order: list[int] = []
        for n in range(coalesce.MAX_QUEUED + 3):
            await coalescer.put(_msg(n))
            order.append(len(groups))  # groups handled by the time this put returned
        await coalescer.stop()
        return groups, order

    groups, order = asyncio.run(main())
    assert [len(g) for g in groups] == [coalesce.MAX_QUEUED, 3]
    assert [n for g in groups for n in g] == [n % 256 for n in range(coalesce.MAX_QUEUED + 3)]
    assert order[coalesce.MAX_QUEUED - 2] == 0 and order[coalesce.MAX_QUEUED - 1] == 1


def test_a_failing_handler_does_not_stop_the_groups_after_it():
    async def main() -> list[list[int]]:
        groups: list[list[int]] = []

        async def handle(group: list[Msg]) -> None:
            groups.append(_numbers(group))
            if len(groups) == 1:
                raise RuntimeError("bug")

        coalescer = Coalescer(handle)
        coalescer.start()
        await coalescer.put(_msg(0))
        await asyncio.sleep(0.01)
        await coalescer.put(_msg(1))
        await coalescer.stop()
        return groups

    assert asyncio.run(main()) == [[0], [1]]
