"""req_id -> rank affinity for zmq_to_scheduler, whose state for one req_id lives on one worker.

With ``embedding_port: null`` each prefill rank registers its receive URL through
``/scheduler_receive_url``, before or after the ``/encode``, and even after a failed encode (it
then gets the error part). The worker that holds those registrations must be the one that runs
the request, so the first of them to arrive picks a rank and everything else for that req_id
follows it for a while. Bounded and expiring: losing an entry only costs the routing preference.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from encoder_pod.parallel.router import Router


class ReqAffinity:
    """Which rank holds a req_id's registrations; oldest entries go first when full."""

    def __init__(self, limit: int, ttl_s: float) -> None:
        self._limit = limit
        self._ttl = ttl_s
        self._ranks: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ranks)

    def get(self, req_id: str) -> int | None:
        """The rank bound to ``req_id``, if any and not expired."""
        entry = self._ranks.get(req_id)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def bind(self, req_id: str, rank: int) -> None:
        """Bind ``req_id`` to ``rank`` for the next ``ttl_s`` seconds."""
        self._ranks.pop(req_id, None)
        self._ranks[req_id] = (time.monotonic() + self._ttl, rank)
        # Insertion order is expiry order: drop the expired, then the oldest beyond the bound.
        now = time.monotonic()
        while self._ranks:
            oldest, (expires, _) = next(iter(self._ranks.items()))
            if expires >= now and len(self._ranks) <= self._limit:
                break
            del self._ranks[oldest]

    def settle(self, req_id: str, rank: int, router: Router) -> int:
        """The rank a request runs on, once it holds a slot on ``rank``; binds ``req_id`` to it.

        Waiting for that slot yields the loop, and a registration that arrived meanwhile may have
        bound ``req_id`` to another rank: its receive URLs are there, so the slot moves there too
        (over that rank's limit if need be), unless that rank went down.
        """
        bound = self.get(req_id)
        if bound is not None and bound != rank and router.take(bound):
            router.release(rank)
            rank = bound
        self.bind(req_id, rank)
        return rank
