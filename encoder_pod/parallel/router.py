"""Least-pending routing over the ready workers, ties broken round-robin.

The router owns one number per rank: requests sent to it and not yet answered. A rank takes at
most ``max_inflight`` of them (DP_WORKER_MAX_INFLIGHT), so one slow worker cannot hoard the
queue, yet it holds enough for its own batcher to form batches. When every ready rank is full,
callers wait in FIFO order at the front, bounded by the caller's deadline.

Single-threaded by design: every method runs on the front's event loop, so no locks.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable


class NoWorker(Exception):
    """No rank is ready; the caller turns this into the right 503 (loading, dead, stopping)."""


class Router:
    """Chooses a rank per request and keeps the per-rank in-flight counts."""

    def __init__(self, ranks: int, max_inflight: int) -> None:
        self.pending = [0] * ranks
        self.routed = [0] * ranks
        self._ready = [False] * ranks
        self._max = max_inflight
        self._cursor = 0
        self._waiters: deque[asyncio.Future[int]] = deque()

    @property
    def waiting(self) -> int:
        """Callers waiting for a free slot."""
        return sum(1 for w in self._waiters if not w.done())

    @property
    def any_ready(self) -> bool:
        """True when at least one rank takes traffic."""
        return any(self._ready)

    def is_ready(self, rank: int) -> bool:
        """True when ``rank`` takes traffic."""
        return self._ready[rank]

    def set_ready(self, rank: int, ready: bool) -> None:
        """A rank joins (its model is loaded) or leaves (died, restarting, stopping)."""
        self._ready[rank] = ready
        if ready:
            self._wake()

    def pick(self, full_ok: bool = False) -> int | None:
        """The ready rank with the fewest pending requests below the limit; ties round-robin.

        ``full_ok`` lifts the limit (a choice that takes no slot, such as where a registration goes).
        """
        best: int | None = None
        n = len(self.pending)
        for step in range(n):
            rank = (self._cursor + step) % n
            if not self._ready[rank] or (self.pending[rank] >= self._max and not full_ok):
                continue
            if best is None or self.pending[rank] < self.pending[best]:
                best = rank
        return best

    def take(self, rank: int) -> bool:
        """Hold a slot on this very rank, over its limit if need be (req_id affinity); False if down."""
        if not self._ready[rank]:
            return False
        self._take(rank)
        return True

    def take_free(self, rank: int) -> bool:
        """Hold a slot on this very rank if it is ready and below its limit, with nobody waiting (cache affinity)."""
        if not self._ready[rank] or self.pending[rank] >= self._max or self.waiting:
            return False
        self._take(rank)
        return True

    def _take(self, rank: int) -> int:
        self.pending[rank] += 1
        self.routed[rank] += 1
        # The next search starts after this rank, so equal loads rotate instead of piling on rank 0.
        self._cursor = (rank + 1) % len(self.pending)
        return rank

    async def acquire(self) -> int:
        """A rank for one request (its slot is held until :meth:`release`).

        Raises :class:`NoWorker` at once when no rank is ready; otherwise waits, first come first
        served, for a slot. Cancel the caller to stop waiting (deadline, client gone).
        """
        if not any(self._ready):
            raise NoWorker()
        if not self._waiters:
            rank = self.pick()
            if rank is not None:
                return self._take(rank)
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            # A slot handed over in the same tick as the cancel must not leak.
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release(waiter.result())
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def release(self, rank: int) -> None:
        """The request on ``rank`` is answered: free its slot and hand it to the next waiter."""
        self.pending[rank] -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            if self._waiters[0].done():
                self._waiters.popleft()
                continue
            rank = self.pick()
            if rank is None:
                return
            self._waiters.popleft().set_result(self._take(rank))

    def fail_waiters(self, make_error: Callable[[], Exception]) -> int:
        """Answer every waiting caller with a fresh ``make_error()`` (all ranks gone, shutdown)."""
        count = 0
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(make_error())
                count += 1
        return count
