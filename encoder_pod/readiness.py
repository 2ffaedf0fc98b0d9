"""How readiness is judged, once for every mode: live traffic proves the encoder works.

A probe encode (``/health``) is skipped while a real /encode succeeded in the last
:data:`HEALTH_SKIP_S` seconds: a busy pod must not queue a probe behind the work that just
proved it healthy. The single-process runtime keeps one :class:`SuccessClock`; the
data-parallel front keeps one per worker incarnation.
"""

from __future__ import annotations

import time

HEALTH_SKIP_S = 5.0
"""Successful live traffic this recent already proves the encoder works: skip the probe encode."""


class SuccessClock:
    """When the last successful encode finished (monotonic seconds; never, until the first)."""

    def __init__(self) -> None:
        self._last = -float("inf")

    def record(self) -> None:
        """A request (or a probe encode) just succeeded."""
        self._last = time.monotonic()

    @property
    def last(self) -> float:
        """Monotonic time of the last success (``-inf`` if none yet)."""
        return self._last

    def proves_ready(self, now: float | None = None) -> bool:
        """True while the last success is recent enough to skip a probe encode."""
        return (time.monotonic() if now is None else now) - self._last < HEALTH_SKIP_S
