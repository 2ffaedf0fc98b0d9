"""The runtime's one cache hook: serve a request's items from the cache, computing only the misses once.

:meth:`ItemCache.encode` takes a request's item keys and a ``compute(indices)`` callable (the
runtime's: decode those items, batch, forward, slice) and returns the request's whole part, in
item order. Per item, in order of preference:

1. **hit**: the store holds it; nothing runs for it.
2. **wait** (single flight): another computation of the same key is under way; the item waits for
   it instead of starting its own.
3. **miss**: the item is claimed, and every claimed item of the request is computed in one call.

A computation belongs to nobody in particular: it runs as long as anyone (its own request or a
waiter) still wants one of its items, and is cancelled (dropped before compute, as any abandoned
request) when the last of them gives up. Its outcome per item:

- rows: stored, and handed to every waiter;
- an error of that item alone (a 400 naming it, or any 400 of a one-item computation): every
  waiter gets it, naming its own ``mm_items[i]``;
- anything else (cancelled, timed out, shut down, a fault, a multi-item failure that cannot be
  pinned on one item): the waiters are released and compute the item themselves (one of them
  claims it again, the others wait for that one). Nobody waits for a verdict that never comes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from prometheus_client import CollectorRegistry

from encoder_pod.cache.entries import CachedItem, join_items, split_part
from encoder_pod.cache.metrics import CacheMetrics
from encoder_pod.cache.store import EmbeddingStore
from encoder_pod.errors import EncoderError, InvalidRequest, ItemError
from encoder_pod.facts import CacheFacts
from encoder_pod.models.base import EncodedPart

Compute = Callable[[list[int]], Awaitable[EncodedPart]]
"""``compute(indices)``: the part of exactly those items of the request, in that order."""


class Abandoned(Exception):
    """The computation an item waited for ended without a verdict on it: compute it yourself."""


@dataclass(eq=False)
class _Computation:
    keys: list[bytes]
    flights: list[asyncio.Future[CachedItem]]
    interest: int = 1
    task: asyncio.Task[tuple[EncodedPart, list[CachedItem]]] | None = None


@dataclass(eq=False)
class _Flight:
    future: asyncio.Future[CachedItem]
    computation: _Computation


@dataclass(eq=False)
class _Plan:
    """One round of a request: what it computes, what it waits for."""

    own: list[int] = field(default_factory=list)
    computation: _Computation | None = None
    waits: dict[int, _Flight] = field(default_factory=dict)


def _settle_future(future: asyncio.Future[CachedItem], outcome: CachedItem | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
        future.exception()  # retrieved: a flight nobody waits for must not log "never retrieved"
    else:
        future.set_result(outcome)


def _attributable(error: BaseException, index: int, count: int) -> bool:
    """True when ``error`` is the verdict on the item at ``index`` itself, for anyone who sends it."""
    if isinstance(error, ItemError):
        return error.index == index
    return count == 1 and isinstance(error, InvalidRequest)


def _as_own(error: BaseException, index: int) -> BaseException:
    """Another request's verdict on an item, naming this request's ``mm_items[index]``."""
    if isinstance(error, ItemError):
        return ItemError(index, error.reason)
    if isinstance(error, EncoderError):
        return EncoderError.from_kind(error.kind, error.message)
    return error


def _retrieve(task: asyncio.Task[tuple[EncodedPart, list[CachedItem]]]) -> None:
    if not task.cancelled():
        task.exception()  # a computation whose requester left: its waiters got the outcome


class ItemCache:
    """The store, the computations in flight, and the metrics of one model replica."""

    def __init__(self, budget_bytes: int, registry: CollectorRegistry) -> None:
        self.store = EmbeddingStore(budget_bytes)
        self.metrics = CacheMetrics(registry, self.store)
        self._flights: dict[bytes, _Flight] = {}

    @property
    def enabled(self) -> bool:
        """False when the budget is 0: the runtime then never calls :meth:`encode`."""
        return self.store.budget_bytes > 0

    @property
    def in_flight(self) -> int:
        """Keys being computed right now."""
        return len(self._flights)

    async def encode(self, keys: Sequence[bytes], compute: Compute) -> EncodedPart:
        """The request's part: hits from the store, waits on computations under way, the rest computed once."""
        found: list[CachedItem | None] = [None] * len(keys)
        while True:
            plan = self._plan(keys, found)
            if plan.computation is None and not plan.waits:
                break
            if plan.computation is not None:
                self._start(plan, compute)
            try:
                whole = await self._settle(plan, found)
            finally:
                self._release(plan)
            if whole is not None and len(plan.own) == len(keys):
                return whole  # computed in one piece: delivered as the forward sliced it
        return join_items([item for item in found if item is not None])

    def _plan(self, keys: Sequence[bytes], found: list[CachedItem | None]) -> _Plan:
        plan = _Plan()
        claimed: dict[bytes, _Flight] = {}
        for index, key in enumerate(keys):
            if found[index] is not None:
                continue
            item = self.store.get(key)
            if item is not None:
                found[index] = item
                self.metrics.count("hits")
                continue
            flight = claimed.get(key) or self._flights.get(key)
            if flight is not None and not flight.future.done():
                plan.waits[index] = flight
                self.metrics.count("single_flight_waits")
                continue
            if plan.computation is None:
                plan.computation = _Computation([], [])
            flight = _Flight(asyncio.get_running_loop().create_future(), plan.computation)
            plan.computation.keys.append(key)
            plan.computation.flights.append(flight.future)
            plan.own.append(index)
            claimed[key] = self._flights[key] = flight
            self.metrics.count("misses")
        for flight in {id(f.computation): f for f in plan.waits.values()}.values():
            flight.computation.interest += 1
        return plan

    def _start(self, plan: _Plan, compute: Compute) -> None:
        assert plan.computation is not None
        task = asyncio.create_task(self._compute(plan.computation, plan.own, compute), name="cache-compute")
        task.add_done_callback(_retrieve)
        plan.computation.task = task

    async def _compute(
        self, computation: _Computation, indices: list[int], compute: Compute
    ) -> tuple[EncodedPart, list[CachedItem]]:
        try:
            part = await compute(indices)
            items = split_part(part)
        except BaseException as exc:
            verdicts = [exc if _attributable(exc, index, len(indices)) else Abandoned() for index in indices]
            for future, verdict in zip(computation.flights, verdicts):
                _settle_future(future, verdict)
            raise
        finally:
            for key, future in zip(computation.keys, computation.flights):
                if (flight := self._flights.get(key)) is not None and flight.future is future:
                    del self._flights[key]
        for key, future, item in zip(computation.keys, computation.flights, items):
            self.store.put(key, item)
            _settle_future(future, item)
        self.metrics.sync()
        return part, items

    async def _settle(self, plan: _Plan, found: list[CachedItem | None]) -> EncodedPart | None:
        """Wait for the plan's computation and flights; fill ``found``; raise the request's error.

        Returns the computation's whole part (None when it computed nothing). An abandoned
        flight leaves its items unfilled, for the next round.
        """
        waiting: dict[asyncio.Future[CachedItem], list[int]] = {}
        for index, flight in plan.waits.items():
            waiting.setdefault(flight.future, []).append(index)
        task = plan.computation.task if plan.computation is not None else None
        pending: set[asyncio.Future[Any]] = set(waiting)
        if task is not None:
            pending.add(task)
        whole: EncodedPart | None = None
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                if future is task:
                    if not task.cancelled():  # cancelled only when the loop itself stops
                        whole, items = task.result()  # the request's own error is raised here
                        for index, item in zip(plan.own, items):
                            found[index] = item
                    continue
                error = future.exception()
                if isinstance(error, Abandoned):
                    continue
                indices = waiting[future]
                if error is not None:
                    raise _as_own(error, indices[0])
                for index in indices:
                    found[index] = future.result()
        return whole

    def _release(self, plan: _Plan) -> None:
        """The request no longer wants this round's items: a computation nobody wants is cancelled."""
        released = [flight.computation for flight in {id(f.computation): f for f in plan.waits.values()}.values()]
        if plan.computation is not None:
            released.append(plan.computation)
        for computation in released:
            computation.interest -= 1
            if computation.interest <= 0 and computation.task is not None and not computation.task.done():
                computation.task.cancel()

    def facts(self) -> CacheFacts:
        """What /server_info shows: budget, fill, counters."""
        store, counts = self.store, self.metrics.counts
        return CacheFacts(
            enabled=self.enabled,
            budget_bytes=store.budget_bytes,
            bytes=store.bytes,
            entries=len(store),
            in_flight=self.in_flight,
            evictions=store.stats.evictions,
            refused_too_large=store.stats.refused,
            hits=counts["hits"],
            misses=counts["misses"],
            single_flight_waits=counts["single_flight_waits"],
        )
