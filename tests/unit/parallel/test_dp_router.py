"""Least-pending routing with round-robin ties, per-worker limits and FIFO waiting."""

from __future__ import annotations

import asyncio
import time

import pytest

from encoder_pod.parallel.affinity import ReqAffinity
from encoder_pod.parallel.router import NoWorker, Router

pytestmark = pytest.mark.unit


def _ready(ranks: int, limit: int = 4) -> Router:
    router = Router(ranks, limit)
    for rank in range(ranks):
        router.set_ready(rank, True)
    return router


def test_equal_loads_rotate_instead_of_piling_on_rank_0():
    router = _ready(3)

    async def scenario() -> list[int]:
        picks = []
        for _ in range(6):
            rank = await router.acquire()
            picks.append(rank)
            router.release(rank)
        return picks

    assert asyncio.run(scenario()) == [0, 1, 2, 0, 1, 2]


def test_least_pending_rank_wins():
    router = _ready(3)

    async def scenario() -> int:
        held = [await router.acquire() for _ in range(3)]  # one on each
        router.release(held[1])  # rank 1 now has the fewest
        return await router.acquire()

    assert asyncio.run(scenario()) == 1


def test_dead_rank_gets_no_traffic_and_none_ready_fails_at_once():
    router = _ready(2)
    router.set_ready(0, False)

    async def scenario() -> list[int]:
        picks = []
        for _ in range(3):
            rank = await router.acquire()
            picks.append(rank)
            router.release(rank)
        router.set_ready(1, False)
        with pytest.raises(NoWorker):
            await router.acquire()
        return picks

    assert asyncio.run(scenario()) == [1, 1, 1]


def test_full_ranks_make_callers_wait_in_order_and_limit_holds():
    router = _ready(2, limit=1)

    async def scenario() -> tuple[list[int], list[int]]:
        first = [await router.acquire(), await router.acquire()]
        waiters = [asyncio.create_task(router.acquire()) for _ in range(3)]
        await asyncio.sleep(0)
        assert router.waiting == 3 and not any(w.done() for w in waiters)
        router.release(first[1])
        await asyncio.sleep(0)
        assert waiters[0].done() and not waiters[1].done()
        assert max(router.pending) <= 1
        router.release(first[0])
        await asyncio.sleep(0)
        assert waiters[1].done() and not waiters[2].done()
        waiters[2].cancel()
        await asyncio.gather(waiters[2], return_exceptions=True)
        return first, [waiters[0].result(), waiters[1].result()]

    first, later = asyncio.run(scenario())
    assert sorted(first) == [0, 1] and later == [1, 0]


def test_cancelled_waiter_leaks_no_slot_and_fail_waiters_answers_all():
    router = _ready(1, limit=1)

    async def scenario() -> None:
        held = await router.acquire()
        waiters = [asyncio.create_task(router.acquire()) for _ in range(2)]
        await asyncio.sleep(0)
        waiters[0].cancel()
        await asyncio.gather(waiters[0], return_exceptions=True)
        assert router.fail_waiters(NoWorker) == 1
        with pytest.raises(NoWorker):
            await waiters[1]
        router.release(held)
        assert router.pending == [0]

    asyncio.run(scenario())


def test_take_pins_a_rank_over_its_limit_but_never_a_dead_one():
    router = _ready(2, limit=1)
    assert router.take(1) and router.take(1) and router.pending == [0, 2]
    assert router.pick() == 0 and router.pick(full_ok=True) == 0
    router.set_ready(0, False)
    assert not router.take(0) and router.pick() is None and router.pick(full_ok=True) == 1


def test_affinity_is_bounded_and_expires():
    affinity = ReqAffinity(limit=2, ttl_s=0.05)
    affinity.bind("a", 1)
    affinity.bind("b", 0)
    affinity.bind("a", 1)  # rebinding refreshes, so "b" is now the oldest
    affinity.bind("c", 0)
    assert (affinity.get("a"), affinity.get("b"), affinity.get("c")) == (1, None, 0) and len(affinity) == 2
    time.sleep(0.06)
    assert affinity.get("a") is None
    affinity.bind("d", 1)
    assert len(affinity) == 1


def test_a_registration_bound_while_the_request_waited_for_a_slot_moves_the_request_to_its_rank():
    """zmq_to_scheduler: the receive URLs went to rank 1 while the encode waited; it must run there."""
    async def scenario() -> None:
        router, affinity = _ready(2, limit=1), ReqAffinity(limit=8, ttl_s=60)
        held = [await router.acquire(), await router.acquire()]  # both ranks full
        waiting = asyncio.ensure_future(router.acquire())
        await asyncio.sleep(0)
        affinity.bind("req", 1)  # what a /scheduler_receive_url arriving now does (pick(full_ok=True))
        router.release(0)  # the waiter is handed rank 0...
        got = await waiting
        assert got == 0
        assert affinity.settle("req", got, router) == 1  # ...and moves to rank 1, where the URLs are
        assert affinity.get("req") == 1 and router.pending == [0, 2]
        router.set_ready(1, False)  # a bound rank that went down keeps the slot where it was handed
        affinity.bind("other", 1)
        assert affinity.settle("other", await router.acquire(), router) == 0 and affinity.get("other") == 0
        for rank in held[1:]:
            router.release(rank)

    asyncio.run(scenario())
