"""How readiness is judged, once for every mode: a replica's state, and live traffic as proof.

:class:`ReplicaState` is the one state of a model replica (the runtime, in this process or in a
data-parallel worker, which reports it to the front); :class:`LoadStep` says what a LOADING
replica is doing, for logs and /server_info.

A probe encode (``/health``) is skipped while a real /encode succeeded in the last
:data:`HEALTH_SKIP_S` seconds: a busy pod must not queue a probe behind the work that just
proved it healthy. The single-process runtime keeps one :class:`SuccessClock`; the
data-parallel front keeps one per worker incarnation.
"""

from __future__ import annotations

import time
from enum import Enum

HEALTH_SKIP_S = 5.0
"""Successful live traffic this recent already proves the encoder works: skip the probe encode."""


class ReplicaState(str, Enum):
    """Life of one model replica."""

    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    """SIGTERM: admitted requests finish, new ones get 503 + Retry-After."""
    FAILED = "failed"
    STOPPING = "stopping"
    """Stopping now: whatever is left gets 503."""


class LoadStep(str, Enum):
    """What a LOADING replica is doing (progress only: the state stays LOADING throughout)."""

    IMPORTING = "importing"
    """A data-parallel worker importing the ML stack (before its runtime exists)."""
    LOADING_WEIGHTS = "loading weights"
    WARMING_UP = "warming up"


class SuccessClock:
    """When the last successful encode finished (monotonic seconds; never, until the first)."""

    def __init__(self) -> None:
        self._last = -float("inf")

    def record(self) -> None:
        """A request (or a probe encode) just succeeded."""
        self._last = time.monotonic()

    def proves_ready(self, now: float | None = None) -> bool:
        """True while the last success is recent enough to skip a probe encode."""
        return (time.monotonic() if now is None else now) - self._last < HEALTH_SKIP_S
