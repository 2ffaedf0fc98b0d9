"""One rank as the front sees it, split by lifetime.

:class:`WorkerRecord` is the rank itself and survives restarts: its placement, its supervision
state, counts of deaths and restarts, the last exit and load error. :class:`Incarnation` is one
process of that rank, from spawn to exit: its socket, heartbeats, what it reports, the calls it
holds. A restart makes a new incarnation; nothing of the old one is reset by hand or carried over.

Writers: the supervisor owns both (spawn, heartbeats, death, restart); the front only registers
its calls on the current incarnation and records their successes.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from enum import Enum
from multiprocessing.process import BaseProcess
from typing import Any, Callable

import zmq

from encoder_pod.errors import NotReady, WorkerDied
from encoder_pod.facts import ReplicaReport
from encoder_pod.parallel.messages import Frame, MetricFamily
from encoder_pod.parallel.placement import Placement
from encoder_pod.parallel.router import Router
from encoder_pod.readiness import LoadStep, ReplicaState

SNDHWM = 100_000
"""Messages queued per worker inbox; far above DP_WORKER_MAX_INFLIGHT, so full means gone."""


class RankState(str, Enum):
    """The supervisor's view of one rank (the replica's own state is its incarnation's)."""

    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(eq=False)
class Incarnation:
    """One worker process of a rank; a fresh one per spawn."""

    generation: int
    process: BaseProcess
    sock: zmq.Socket[Any] | None
    spawned_at: float
    last_seen: float
    """When it last sent a heartbeat (monotonic); its spawn time until then."""
    next_progress_log: float
    heard_from: bool = False
    """Whether it has sent any heartbeat yet."""
    ready_at: float | None = None
    replica: ReplicaState = ReplicaState.LOADING
    step: LoadStep | None = LoadStep.IMPORTING
    report: ReplicaReport | None = None
    """What its replica last reported of itself."""
    metrics: tuple[MetricFamily, ...] | None = None
    """Its replica's metric families, as its last heartbeat carried them (forgotten at its exit)."""
    healthy: bool = False
    """Its replica's readiness verdict, as last reported."""
    health_error: str | None = None
    stalled: bool = False
    """Its tensor-parallel group reported a silent rank."""
    refused: bool = False
    """Its load reported that this pod cannot serve the checkpoint (never retried)."""
    kill_reason: str | None = None
    """Set when the front itself killed the process (hung), so its death is counted as that."""
    calls: dict[int, asyncio.Future[Any]] = field(default_factory=dict)

    @property
    def pid(self) -> int | None:
        """The process id."""
        return self.process.pid

    @property
    def alive(self) -> bool:
        """True until the process has exited."""
        return self.process.exitcode is None

    def send(self, rank: int, frames: list[Frame]) -> None:
        """Queue a message for this process without ever blocking the event loop."""
        if self.sock is None:
            raise WorkerDied(f"worker {rank} is not running")
        try:
            self.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            # A bound PUSH with no connected peer refuses at once: the worker is gone or not up.
            raise NotReady(f"worker {rank} is not accepting messages (it died or is stopping)") from None

    def close(self) -> None:
        """Close the inbox socket (the process exited or the front stops)."""
        if self.sock is not None:
            self.sock.close(0)
            self.sock = None
        self.metrics = None

    def fail_calls(self, make_error: Callable[[], Exception]) -> int:
        """Answer every call this process holds with a fresh ``make_error()``; returns how many."""
        calls, self.calls = self.calls, {}
        for future in calls.values():
            if not future.done():
                future.set_exception(make_error())
        return len(calls)

    @property
    def phase(self) -> str:
        """What it does, in words (/server_info): its load step while loading, else its state."""
        if not self.heard_from:
            return "spawned"
        return self.step.value if self.step is not None else self.replica.value


@dataclass(eq=False)
class WorkerRecord:
    """One rank across its restarts."""

    rank: int
    placement: Placement
    state: RankState = RankState.STARTING
    current: Incarnation | None = None
    """The process now, or the last one (until the next spawn)."""
    deaths: int = 0
    restarts: int = 0
    failed_starts: int = 0
    quick_deaths: int = 0
    last_error: str | None = None
    """The last load error reported (cleared once a start gets ready)."""
    last_exit: str | None = None
    restart_at: float | None = None

    @property
    def generation(self) -> int:
        """The current incarnation's number (0 before the first spawn)."""
        return self.current.generation if self.current is not None else 0

    def send(self, frames: list[Frame]) -> None:
        """Queue a message for the current process; :class:`WorkerDied` when there is none."""
        if self.current is None:
            raise WorkerDied(f"worker {self.rank} is not running ({self.state.value})")
        self.current.send(self.rank, frames)

    def describe(self, router: Router) -> dict[str, Any]:
        """This rank in /server_info."""
        now = time.monotonic()
        inc = self.current
        report = inc.report if inc is not None else None
        model = report.model if report is not None else None
        restarting = self.state is RankState.RESTARTING and self.restart_at
        return {
            "rank": self.rank,
            "state": self.state.value,
            "phase": inc.phase if inc is not None else "spawning",
            "pid": inc.pid if inc is not None else None,
            "generation": self.generation,
            "placement": self.placement.describe(),
            "starting_for_s": round(now - inc.spawned_at, 1) if inc is not None and self.state is RankState.STARTING else None,
            "restart_in_s": round(max(0.0, self.restart_at - now), 1) if restarting and self.restart_at else None,
            "health": (inc.health_error or "ready") if inc is not None and inc.heard_from else None,
            "heartbeat_s_ago": round(now - inc.last_seen, 2) if inc is not None and inc.heard_from else None,
            "pending": router.pending[self.rank],
            "routed": router.routed[self.rank],
            "queue_depth": report.queue_depth if report is not None else 0,
            "deaths": self.deaths,
            "restarts": self.restarts,
            "failed_starts": self.failed_starts,
            "last_exit": self.last_exit,
            "load_error": self.last_error,
            "model": model.to_json() if model is not None else None,
            "cache": report.cache.to_json() if report is not None else None,
        }
