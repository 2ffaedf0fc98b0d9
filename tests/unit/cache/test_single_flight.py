"""Single flight and mixed hits/misses in ItemCache, driven by a compute function of our own.

The compute function stands in for the runtime's (decode, batch, forward, slice): it returns
real parts whose rows say which item they are, and can be held open or made to fail, so every
interleaving here is exact. The runtime's own path is covered by tests/integration/test_cache*.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

import pytest
import torch
from prometheus_client import CollectorRegistry

from encoder_pod.cache.lookup import ItemCache
from encoder_pod.errors import InternalError, InvalidRequest, ItemError, ShuttingDown
from encoder_pod.models.base import EncodedPart

pytestmark = pytest.mark.unit

HIDDEN = 4


def rows_of(key: bytes, tokens: int = 2) -> torch.Tensor:
    """Rows that identify their item: every value is the key's first byte."""
    return torch.full((tokens, HIDDEN), float(key[0]))


class Model:
    """A compute function: counts calls and the items it computed; can be gated or made to fail."""

    def __init__(self, keys_of_request: list[bytes]) -> None:
        self.keys = keys_of_request
        self.calls: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.started = asyncio.Event()
        self.error: BaseException | None = None
        """Raised by the next computation only."""
        self.bad: dict[bytes, str] = {}
        """Items that are refused (ItemError naming them), every time."""
        self.cancelled = 0

    def for_request(self, keys: list[bytes]) -> Callable[[list[int]], Awaitable[EncodedPart]]:
        async def compute(indices: list[int]) -> EncodedPart:
            self.calls.append(list(indices))
            self.started.set()
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            if self.error is not None:
                error, self.error = self.error, None
                raise error
            for i in indices:
                if keys[i] in self.bad:
                    raise ItemError(i, self.bad[keys[i]])
            rows = torch.cat([rows_of(keys[i]) for i in indices])
            return EncodedPart(rows, [2] * len(indices), [[1, 2, 2]] * len(indices))

        return compute


def key(n: int) -> bytes:
    return bytes([n]) * 32


def cache(budget: int = 1 << 20) -> ItemCache:
    return ItemCache(budget, CollectorRegistry())


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_64_identical_requests_arriving_together_compute_once():
    async def scenario() -> None:
        c, model = cache(), Model([])
        model.gate.clear()
        keys = [key(7)]
        tasks = [asyncio.create_task(c.encode(keys, model.for_request(keys))) for _ in range(64)]
        await model.started.wait()
        await settle()
        model.gate.set()
        parts = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert model.calls == [[0]]
        assert all(torch.equal(p.embedding, rows_of(key(7))) for p in parts)
        assert c.metrics.counts == {"hits": 0, "misses": 1, "single_flight_waits": 63}
        assert c.in_flight == 0 and len(c.store) == 1

    asyncio.run(scenario())


def test_a_mixed_request_computes_only_its_misses_and_keeps_item_order():
    async def scenario() -> None:
        c, model = cache(), Model([])
        first = [key(1), key(3)]
        await c.encode(first, model.for_request(first))
        mixed = [key(3), key(2), key(1), key(4), key(2)]
        part = await c.encode(mixed, model.for_request(mixed))
        assert model.calls == [[0, 1], [1, 3]]  # 2 and 4 only; the second 2 waits for the first
        assert torch.equal(part.embedding, torch.cat([rows_of(k) for k in mixed]))
        assert part.item_tokens == [2] * 5 and part.item_grids == [[1, 2, 2]] * 5
        assert c.metrics.counts == {"hits": 2, "misses": 4, "single_flight_waits": 1}

    asyncio.run(scenario())


def test_the_computing_request_leaving_does_not_stop_its_waiters():
    async def scenario() -> None:
        c, model = cache(), Model([])
        model.gate.clear()
        keys = [key(9)]
        leader = asyncio.create_task(c.encode(keys, model.for_request(keys)))
        await model.started.wait()
        waiters = [asyncio.create_task(c.encode(keys, model.for_request(keys))) for _ in range(8)]
        await settle()
        leader.cancel()  # its client disconnected mid-way
        await settle()
        assert model.cancelled == 0  # still wanted by the waiters
        model.gate.set()
        parts = await asyncio.wait_for(asyncio.gather(*waiters), 10)
        assert all(torch.equal(p.embedding, rows_of(key(9))) for p in parts)
        assert model.calls == [[0]] and leader.cancelled()

    asyncio.run(scenario())


def test_a_computation_nobody_wants_any_more_is_cancelled_and_leaves_no_flight():
    async def scenario() -> None:
        c, model = cache(), Model([])
        model.gate.clear()
        keys = [key(5)]
        tasks = [asyncio.create_task(c.encode(keys, model.for_request(keys))) for _ in range(3)]
        await model.started.wait()
        await settle()
        for task in tasks:
            task.cancel()
        await settle()
        assert model.cancelled == 1 and c.in_flight == 0
        model.gate.set()
        part = await asyncio.wait_for(c.encode(keys, model.for_request(keys)), 10)  # a new computation, not a stale one
        assert torch.equal(part.embedding, rows_of(key(5))) and len(model.calls) == 2

    asyncio.run(scenario())


def test_an_error_of_the_item_reaches_every_waiter_naming_its_own_index():
    async def scenario() -> None:
        c, model = cache(), Model([])
        model.gate.clear()
        model.bad[key(6)] = "not an image"
        leader = asyncio.create_task(c.encode([key(6)], model.for_request([key(6)])))
        await model.started.wait()
        other = [key(1), key(6)]
        waiter = asyncio.create_task(c.encode(other, model.for_request(other)))
        await settle()
        model.gate.set()
        results = await asyncio.wait_for(asyncio.gather(leader, waiter, return_exceptions=True), 10)
        assert isinstance(results[0], ItemError) and results[0].message == "mm_items[0]: not an image"
        assert isinstance(results[1], ItemError) and results[1].message == "mm_items[1]: not an image"
        assert len(model.calls) == 2  # the waiter computed its other item, never the bad one again
        assert c.store.get(key(6)) is None and c.store.get(key(1)) is not None  # failures are not cached

    asyncio.run(scenario())


@pytest.mark.parametrize("error", [ShuttingDown("stopping"), InternalError("boom"), InvalidRequest("one of two is bad")])
def test_a_failure_not_pinned_on_the_item_makes_waiters_compute_alone(error):
    async def scenario() -> None:
        c, model = cache(), Model([])
        model.gate.clear()
        model.error = error
        pair = [key(2), key(8)]  # a two-item computation: a 400 of it cannot be pinned on key(8)
        leader = asyncio.create_task(c.encode(pair, model.for_request(pair)))
        await model.started.wait()
        waiter = asyncio.create_task(c.encode([key(8)], model.for_request([key(8)])))
        await settle()
        model.gate.set()
        with pytest.raises(type(error)):
            await asyncio.wait_for(leader, 10)
        part = await asyncio.wait_for(waiter, 10)
        assert torch.equal(part.embedding, rows_of(key(8)))
        assert model.calls == [[0, 1], [0]]

    asyncio.run(scenario())


def test_budget_zero_is_off():
    assert not cache(0).enabled and cache(1).enabled
