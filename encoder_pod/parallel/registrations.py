"""zmq_to_scheduler receive URLs that arrive before their request has been routed.

A prefill rank may register where it receives a request's embedding before or after the
``/encode`` of that request. Only the worker that runs the request needs the URL, and which one
that is is known only once the request is routed, so early registrations wait here (bounded,
and forgotten after the request timeout) and go out right before the request does.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from encoder_pod.errors import Overloaded


class EarlyRegistrations:
    """Receive-URL payloads per req_id, waiting for their request."""

    def __init__(self, limit: int, ttl_s: float) -> None:
        self._limit = limit
        self._ttl = ttl_s
        self._by_req: OrderedDict[str, tuple[float, list[dict[str, Any]]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_req)

    def add(self, req_id: str, payload: dict[str, Any]) -> None:
        """Keep ``payload`` until ``req_id`` is routed; 429 when too many requests have some waiting."""
        self._expire()
        if req_id not in self._by_req and len(self._by_req) >= self._limit:
            raise Overloaded(f"{self._limit} receive-URL registrations are waiting for their requests; retry later")
        _, payloads = self._by_req.setdefault(req_id, (time.monotonic(), []))
        payloads.append(payload)

    def take(self, req_id: str) -> list[dict[str, Any]]:
        """Every payload waiting for ``req_id`` (removed)."""
        entry = self._by_req.pop(req_id, None)
        return entry[1] if entry else []

    def _expire(self) -> None:
        # Insertion order is age order, so the oldest are at the front.
        cutoff = time.monotonic() - self._ttl
        while self._by_req:
            req_id, (added, _) = next(iter(self._by_req.items()))
            if added >= cutoff:
                break
            del self._by_req[req_id]
