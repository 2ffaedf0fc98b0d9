"""One rank as the front sees it: its current process, inbox socket, state and held calls."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from enum import Enum
from multiprocessing.process import BaseProcess
from typing import Any, Callable

import zmq

from encoder_pod.errors import NotReady, WorkerDied
from encoder_pod.parallel.placement import Placement
from encoder_pod.parallel.router import Router

SNDHWM = 100_000
"""Messages queued per worker inbox; far above DP_WORKER_MAX_INFLIGHT, so full means gone."""


class RankState(str, Enum):
    """The front's view of one rank."""

    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(eq=False)
class WorkerHandle:
    """One rank: its current process, inbox socket, state and the calls it holds."""

    rank: int
    placement: Placement
    state: RankState = RankState.STARTING
    generation: int = 0
    process: BaseProcess | None = None
    sock: zmq.Socket | None = None
    pid: int | None = None
    phase: str = "spawning"
    spawned_at: float = 0.0
    ready_at: float | None = None
    last_error: str | None = None
    last_exit: str | None = None
    restart_at: float | None = None
    info: dict[str, Any] | None = None
    metrics: bytes | None = None
    deaths: int = 0
    restarts: int = 0
    failed_starts: int = 0
    quick_deaths: int = 0
    next_progress_log: float = 0.0
    last_seen: float = 0.0
    """When the current incarnation last sent a heartbeat (monotonic); its spawn time until then."""
    heard_from: bool = False
    """Whether the current incarnation has sent any heartbeat yet."""
    last_success: float = 0.0
    """When the current incarnation last answered an /encode with success (monotonic)."""
    kill_reason: str | None = None
    """Set when the front itself killed the process (hung), so its death is counted as that."""
    calls: dict[int, asyncio.Future[Any]] = field(default_factory=dict)

    def send(self, frames: list[bytes]) -> None:
        """Queue a message for this rank without ever blocking the event loop."""
        if self.sock is None:
            raise WorkerDied(f"worker {self.rank} is not running ({self.state.value})")
        try:
            self.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            # A bound PUSH with no connected peer refuses at once: the worker is gone or not up.
            raise NotReady(f"worker {self.rank} is not accepting messages (it died or is stopping)") from None

    def fail_calls(self, make_error: Callable[[], Exception]) -> int:
        """Answer every call this rank holds with a fresh ``make_error()``; returns how many."""
        calls, self.calls = self.calls, {}
        for future in calls.values():
            if not future.done():
                future.set_exception(make_error())
        return len(calls)

    def describe(self, router: Router) -> dict[str, Any]:
        """This rank in /server_info."""
        now = time.monotonic()
        info = self.info or {}
        return {
            "rank": self.rank,
            "state": self.state.value,
            "phase": self.phase,
            "pid": self.pid,
            "generation": self.generation,
            "placement": self.placement.describe(),
            "starting_for_s": round(now - self.spawned_at, 1) if self.state is RankState.STARTING else None,
            "restart_in_s": round(max(0.0, self.restart_at - now), 1) if self.state is RankState.RESTARTING and self.restart_at else None,
            "pending": router.pending[self.rank],
            "routed": router.routed[self.rank],
            "queue_depth": info.get("queue_depth", 0),
            "deaths": self.deaths,
            "restarts": self.restarts,
            "failed_starts": self.failed_starts,
            "last_exit": self.last_exit,
            "load_error": self.last_error,
            "model": info.get("model"),
        }
