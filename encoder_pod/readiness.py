"""How readiness is judged, once for every mode: a replica's state, and a cached verdict.

:class:`ReplicaState` is the one state of a model replica (the runtime, in this process or in a
data-parallel worker, which reports it to the front); :class:`LoadStep` says what a LOADING
replica is doing, for logs and /server_info.

``/health`` never waits for model work: it answers from a :class:`Readiness` verdict that the
replica keeps fresh. Live traffic proves the encoder works (every successful /encode is
recorded); when none succeeded in the last :data:`HEALTH_SKIP_S` seconds, a background prober
runs a real tiny encode on the batcher's priority lane (ahead of every waiting request; only the
forward already running and the batch already preprocessed for it come first). The verdict is
"not ready" when the last probe failed, or when a probe has been waiting longer than
``ENCODER_HEALTH_TIMEOUT`` (the model is stuck, or one forward takes longer than that), or
before the first probe finished.
"""

from __future__ import annotations

import math
import time
from enum import Enum
from typing import Any

HEALTH_SKIP_S = 5.0
"""Successful live traffic this recent already proves the encoder works: no probe encode is run."""
PROBE_TICK_S = 0.5
"""How often the prober looks whether a probe encode is due."""
STALE_HEARTBEAT_S = 2.0
"""A process (data-parallel worker, tensor-parallel follower) silent this long is not ready: /health
503 and no new traffic at once; it is killed only at ENCODER_DP_HEARTBEAT_TIMEOUT. Heartbeats come
every 0.5 s."""


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
        self.last = -math.inf

    def record(self, now: float | None = None) -> None:
        """A request (or a probe encode) just succeeded."""
        self.last = time.monotonic() if now is None else now

    def proves_ready(self, now: float | None = None) -> bool:
        """True while the last success is recent enough to skip a probe encode."""
        return (time.monotonic() if now is None else now) - self.last < HEALTH_SKIP_S


class Readiness:
    """The cached readiness verdict of one replica: live successes and its prober's outcomes.

    Single-threaded (the replica's event loop). Nothing here waits: :meth:`problem` is what
    ``/health`` answers, at once.
    """

    def __init__(self, health_timeout: float) -> None:
        self.health_timeout = health_timeout
        self.success = SuccessClock()
        self._failure: str | None = None
        self._failed_at = -math.inf
        self._probe_since: float | None = None
        self.probes = 0
        self.last_probe_s: float | None = None

    def probe_due(self, now: float | None = None) -> bool:
        """True when no probe runs and no success is recent."""
        return self._probe_since is None and not self.success.proves_ready(now)

    def probe_started(self, now: float | None = None) -> None:
        """The prober submitted a probe encode."""
        self._probe_since = time.monotonic() if now is None else now

    def probe_finished(self, error: str | None, now: float | None = None) -> None:
        """The probe encode succeeded (``error`` None) or failed with ``error``."""
        now = time.monotonic() if now is None else now
        if self._probe_since is not None:
            self.last_probe_s = now - self._probe_since
        self._probe_since, self.probes = None, self.probes + 1
        if error is None:
            self.success.record(now)
        else:
            self._failure, self._failed_at = error, now

    def problem(self, now: float | None = None) -> str | None:
        """Why the replica is not ready (None when it is), from state only."""
        now = time.monotonic() if now is None else now
        if self._probe_since is not None and now - self._probe_since > self.health_timeout:
            return (
                f"health encode has not finished after {now - self._probe_since:.1f}s "
                f"(ENCODER_HEALTH_TIMEOUT={self.health_timeout:g}s)"
            )
        if self._failed_at > self.success.last:
            return f"health encode failed: {self._failure}"
        if self.success.last == -math.inf:
            return "the first health encode has not finished yet"
        return None

    def describe(self, now: float | None = None) -> dict[str, Any]:
        """The verdict in /server_info."""
        now = time.monotonic() if now is None else now
        last = self.success.last
        return {
            "ready": self.problem(now) is None,
            "problem": self.problem(now),
            "last_success_s_ago": round(now - last, 3) if last != -math.inf else None,
            "probe_running_s": round(now - self._probe_since, 3) if self._probe_since is not None else None,
            "probes": self.probes,
            "last_probe_s": round(self.last_probe_s, 4) if self.last_probe_s is not None else None,
        }
