"""The worker processes: spawn, watch, restart with backoff, stop.

Death is noticed through each process's sentinel (a file descriptor that becomes readable when
the process exits) registered on the front's event loop, so a SIGKILL or OOM kill is seen within
milliseconds, without polling. The calls a dead worker held are failed with 503 at once; the
rank leaves the router and comes back only when its successor reports its model loaded.

A start that never got ready is a failed start, retried (a GPU can fail transiently) until
ENCODER_DP_MAX_FAILED_STARTS in a row; a load that refused the checkpoint is not retried (it
would fail the same way). Either way the rank is given up and the front is told
(``on_given_up``): the pod cannot serve its model and stops, exit code ``MODEL_LOAD_FAILED``.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import signal
import time
from typing import Any, Callable

import zmq

from encoder_pod.errors import NotReady, WorkerDied
from encoder_pod.exitcodes import ExitCode
from encoder_pod.parallel.handle import SNDHWM, Incarnation, RankState, WorkerRecord
from encoder_pod.parallel.ipc import IpcDir
from encoder_pod.parallel.messages import Status, Stop, WorkerSpec, pack
from encoder_pod.parallel.placement import Placement
from encoder_pod.parallel.ranked_metrics import DataParallelMetrics
from encoder_pod.parallel.router import Router
from encoder_pod.parallel.worker import run_worker
from encoder_pod.readiness import STALE_HEARTBEAT_S, ReplicaState
from encoder_pod.settings import EncoderSettings

log = logging.getLogger(__name__)

BACKOFF_CAP_S = 30.0
"""Longest wait before a restart: a crash-looping worker costs at most one start per 30 s."""
STABLE_S = 60.0
"""A worker ready this long before it died starts its backoff over (its death was not a loop)."""
PROGRESS_LOG_S = 10.0
"""How often a slow model load is logged."""
LOADING_SILENCE_S = 60.0
"""Silence allowed while a worker is starting (interpreter start, imports, weights, warmup on a
busy host), at least; ENCODER_DP_HEARTBEAT_TIMEOUT applies once it is ready."""
LIVENESS_TICK_S = 0.25
"""How often heartbeats are checked for staleness."""
FINAL_STATUS_S = 2.0
"""How long a worker that exited ``MODEL_LOAD_FAILED`` may take to have its last status read: it
sends it before it exits (whether the load refused the checkpoint), but the front may see the
exit first."""


def restart_delay(base: float, quick_deaths: int) -> float:
    """Exponential backoff: ``base`` after the first quick death, doubling, capped."""
    return min(BACKOFF_CAP_S, base * 2 ** max(0, quick_deaths - 1))


DEATH_REASONS = ("killed", "crashed", "hung", "load_failed", "tp_group_down", "exited", "unknown")
"""Every ``reason`` of ``encoder_dp_worker_deaths_total`` (:func:`describe_exit`, and ``hung``)."""


def describe_exit(code: int | None) -> tuple[str, str]:
    """(metric reason, human text) of a process exit code."""
    if code is None:
        return "unknown", "exit status unknown"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return "killed", f"killed by {name}"
    if code == ExitCode.MODEL_LOAD_FAILED:
        return "load_failed", "model failed to load"
    if code == ExitCode.TP_GROUP_DOWN:
        return "tp_group_down", "tensor-parallel group went down (a rank died or a collective failed or timed out)"
    if code == 0:
        return "exited", "exited with code 0"
    return "crashed", f"exited with code {code}"


class Supervisor:
    """Owns the worker processes of one front."""

    def __init__(
        self,
        settings: EncoderSettings,
        placements: list[Placement],
        ipc: IpcDir,
        zctx: zmq.Context[Any],
        router: Router,
        metrics: DataParallelMetrics,
        on_rank_down: Callable[[int], None],
        on_given_up: Callable[[int, str], None],
    ) -> None:
        """``on_rank_down(rank)``: a worker left service; ``on_given_up(rank, reason)``: a rank will
        not be started again (its load refused the checkpoint, or it failed too many starts)."""
        self.settings = settings
        self.handles = [WorkerRecord(p.rank, p) for p in placements]
        self._ipc = ipc
        self._zctx = zctx
        self._router = router
        self._metrics = metrics
        self._on_rank_down = on_rank_down
        self._on_given_up = on_given_up
        self._mp = multiprocessing.get_context("spawn")
        self._restarts: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._liveness: asyncio.Task[None] | None = None
        self._benched: set[int] = set()
        """Ready ranks taken out of routing while they are silent or their group is stalled."""

    def start_all(self) -> None:
        """Spawn every worker (returns at once; each reports ready when its model is loaded)."""
        self._loop = asyncio.get_running_loop()
        for handle in self.handles:
            self._metrics.up.labels(rank=str(handle.rank)).set(0)
            # Exported at 0 from the start, so increase() over a window counts the first death and restart.
            self._metrics.restarts.labels(rank=str(handle.rank))
            for reason in DEATH_REASONS:
                self._metrics.deaths.labels(rank=str(handle.rank), reason=reason)
            self._spawn(handle)
        self._liveness = self._loop.create_task(self._liveness_loop(), name="dp-liveness")

    async def _liveness_loop(self) -> None:
        """Kill a worker whose heartbeats stopped (a wedged event loop, SIGSTOP, a stuck driver call).

        Heartbeats come from the worker's event loop, which never runs model work, so silence
        means the process can no longer answer anything. Silent for STALE_HEARTBEAT_S, it gets no
        new traffic (and /health says so); silent for ENCODER_DP_HEARTBEAT_TIMEOUT, it is killed
        and its death takes the usual path (held requests 503, restart).
        """
        timeout = self.settings.parallel.dp_heartbeat_timeout
        while True:
            await asyncio.sleep(LIVENESS_TICK_S)
            now = time.monotonic()
            for handle in self.handles:
                inc = handle.current
                if inc is None or not inc.alive or inc.kill_reason or handle.state not in (RankState.STARTING, RankState.READY):
                    continue
                self._route_if_fit(handle, inc, now)
                silent = now - inc.last_seen
                if silent > (timeout if handle.state is RankState.READY else max(timeout, LOADING_SILENCE_S)):
                    inc.kill_reason = "hung"
                    log.error(
                        "rank %d: no heartbeat from pid %d for %.1fs (ENCODER_DP_HEARTBEAT_TIMEOUT); killing it",
                        handle.rank, inc.pid, silent,
                    )
                    inc.process.kill()

    def _spawn(self, handle: WorkerRecord) -> None:
        """Start a new incarnation of ``handle``'s rank (a fresh record of that process)."""
        assert self._loop is not None
        generation = handle.generation + 1
        address = self._ipc.worker_inbox(handle.rank, generation)
        sock = self._zctx.socket(zmq.PUSH, socket_class=zmq.Socket)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, SNDHWM)
        sock.bind(address)
        placed = {"num_threads": handle.placement.num_threads, "device": handle.placement.device}
        settings = self.settings.model_copy(update={"model": self.settings.model.model_copy(update=placed)})
        spec = WorkerSpec(handle.rank, generation, address, self._ipc.results, settings.model_dump_json(), handle.placement.env)
        process = self._mp.Process(target=run_worker, args=(spec.to_json(),), name=f"encoder-dp-{handle.rank}", daemon=True)
        process.start()
        now = time.monotonic()
        inc = Incarnation(generation, process, sock, now, now, now + PROGRESS_LOG_S)
        handle.current, handle.state, handle.restart_at = inc, RankState.STARTING, None
        self._loop.add_reader(process.sentinel, self._on_exit, handle, inc)
        log.info(
            "rank %d: worker pid %d started (generation %d, %s)", handle.rank, process.pid, generation, handle.placement.describe()
        )

    # --- what the workers report ----------------------------------------------------------
    def on_status(self, msg: Status) -> None:
        """A worker's heartbeat: state changes, load progress, its report and metrics."""
        if not 0 <= msg.rank < len(self.handles):
            log.error("status from unknown rank %d", msg.rank)
            return
        handle = self.handles[msg.rank]
        inc = handle.current
        if inc is None or msg.generation != inc.generation:
            return  # a late heartbeat of a dead incarnation
        inc.last_seen, inc.heard_from = time.monotonic(), True
        inc.replica, inc.step = msg.state, msg.step
        inc.healthy, inc.health_error, inc.stalled = msg.healthy, msg.health_error, msg.stalled
        inc.report = msg.report if msg.report is not None else inc.report
        if msg.error:
            handle.last_error = msg.error
        inc.refused = inc.refused or msg.refused
        if handle.state not in (RankState.STARTING, RankState.READY):
            return
        inc.metrics = msg.metrics if msg.metrics is not None else inc.metrics
        self._follow(handle, inc, msg)
        self._route_if_fit(handle, inc, inc.last_seen)

    def _route_if_fit(self, handle: WorkerRecord, inc: Incarnation, now: float) -> None:
        """A ready rank takes traffic only while its replica serves, it is heard from and its group is whole."""
        if handle.state is not RankState.READY or self._stopping:
            return
        silent = now - inc.last_seen
        fit = inc.replica is ReplicaState.READY and not inc.stalled and silent <= STALE_HEARTBEAT_S
        if fit == self._router.is_ready(handle.rank):
            return
        self._router.set_ready(handle.rank, fit)
        self._metrics.up.labels(rank=str(handle.rank)).set(1 if fit else 0)
        if not fit:
            self._benched.add(handle.rank)
            why = inc.health_error if inc.stalled else f"no heartbeat for {silent:.1f}s" if silent > STALE_HEARTBEAT_S else inc.replica.value
            log.warning("rank %d: no new traffic (%s)", handle.rank, why)
        elif handle.rank in self._benched:
            self._benched.discard(handle.rank)
            log.info("rank %d: heard from again; takes traffic", handle.rank)

    def _follow(self, handle: WorkerRecord, inc: Incarnation, msg: Status) -> None:
        """The rank's state follows what its replica reports."""
        now = time.monotonic()
        if msg.state is ReplicaState.READY and handle.state is RankState.STARTING:
            handle.state, inc.ready_at = RankState.READY, now
            handle.failed_starts, handle.last_error = 0, None
            log.info("rank %d: ready in %.1fs (pid %d)", handle.rank, now - inc.spawned_at, inc.pid)
        elif msg.state is ReplicaState.LOADING and now >= inc.next_progress_log:
            inc.next_progress_log = now + PROGRESS_LOG_S
            log.info("rank %d: still loading (%s, %.0fs)", handle.rank, inc.phase, msg.elapsed_s)

    # --- death and restart ------------------------------------------------------------------
    def _on_exit(self, handle: WorkerRecord, inc: Incarnation) -> None:
        """The process's sentinel fired: it is exiting. Take it out of service now."""
        assert self._loop is not None
        self._loop.remove_reader(inc.process.sentinel)
        if handle.current is not inc:
            return
        generation = inc.generation
        handle.state = RankState.STOPPED if self._stopping else RankState.RESTARTING
        self._benched.discard(handle.rank)
        self._router.set_ready(handle.rank, False)
        self._metrics.up.labels(rank=str(handle.rank)).set(0)
        inc.close()
        self._ipc.remove_inbox(handle.rank, generation)
        pid = inc.pid
        held = inc.fail_calls(lambda: WorkerDied(f"worker {handle.rank} (pid {pid}) died while holding this request"))
        if not self._stopping:
            self._on_rank_down(handle.rank)
        task = self._loop.create_task(self._reap(handle, inc, held))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _reap(self, handle: WorkerRecord, inc: Incarnation, held: int) -> None:
        """Collect the exit status, then log, count and schedule the restart."""
        process = inc.process
        # The sentinel fires when the process's files close, which is before it is a zombie
        # (a GPU driver's teardown can sit in between): poll without blocking the loop.
        deadline = time.monotonic() + 10
        while process.exitcode is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if process.exitcode == ExitCode.MODEL_LOAD_FAILED:
            deadline = time.monotonic() + FINAL_STATUS_S
            while inc.replica is not ReplicaState.FAILED and time.monotonic() < deadline:
                await asyncio.sleep(0.01)  # its last status (error, refused) is on its way
        reason, text = describe_exit(process.exitcode)
        if inc.kill_reason == "hung":
            reason, text = "hung", f"killed after {self.settings.parallel.dp_heartbeat_timeout:g}s without a heartbeat"
        if self._stopping:
            handle.state = RankState.STOPPED
            log.info("rank %d: worker pid %d stopped (%s)", handle.rank, inc.pid, text)
            return
        handle.deaths += 1
        handle.last_exit = text
        self._metrics.deaths.labels(rank=str(handle.rank), reason=reason).inc()
        log.error("rank %d: worker pid %d died: %s; %d held requests answered 503", handle.rank, inc.pid, text, held)
        if handle.current is inc:
            self._schedule_restart(handle, inc.ready_at, refused=inc.refused and inc.ready_at is None)

    def _schedule_restart(self, handle: WorkerRecord, ready_at: float | None, refused: bool = False) -> None:
        """``ready_at``: when the incarnation that died got ready (None: it never did, a failed start);
        ``refused``: its load refused the checkpoint (the rank is given up, not restarted)."""
        assert self._loop is not None
        now = time.monotonic()
        if ready_at is None:
            handle.failed_starts += 1
        stable = ready_at is not None and now - ready_at >= STABLE_S
        handle.quick_deaths = 1 if stable else handle.quick_deaths + 1
        last = handle.last_error or handle.last_exit or "unknown"
        if refused:
            self._give_up(handle, last)
            return
        if handle.failed_starts >= self.settings.parallel.dp_max_failed_starts:
            log.error("rank %d: %d failed starts in a row (ENCODER_DP_MAX_FAILED_STARTS)", handle.rank, handle.failed_starts)
            self._give_up(handle, f"{last} (after {handle.failed_starts} failed starts)")
            return
        delay = restart_delay(self.settings.parallel.dp_restart_backoff, handle.quick_deaths)
        handle.state, handle.restart_at = RankState.RESTARTING, now + delay
        log.warning("rank %d: restarting in %.1fs", handle.rank, delay)
        task = self._loop.create_task(self._restart_later(handle, delay, handle.generation))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    def _give_up(self, handle: WorkerRecord, reason: str) -> None:
        """The rank will not be started again: the front stops the pod (it cannot serve its model)."""
        handle.state = RankState.FAILED
        log.error("rank %d: given up: %s", handle.rank, reason)
        self._on_given_up(handle.rank, reason)

    async def _restart_later(self, handle: WorkerRecord, delay: float, generation: int) -> None:
        await asyncio.sleep(delay)
        if self._stopping or handle.generation != generation:
            return
        handle.restarts += 1
        self._metrics.restarts.labels(rank=str(handle.rank)).inc()
        log.info("rank %d: restart #%d", handle.rank, handle.restarts)
        try:
            self._spawn(handle)
        except Exception as exc:  # noqa: BLE001 - a failed spawn is one more failed start
            handle.last_error = f"spawn failed: {type(exc).__name__}: {exc}"
            log.exception("rank %d: spawn failed", handle.rank)
            self._schedule_restart(handle, ready_at=None)

    # --- stop -------------------------------------------------------------------------------
    async def stop(self, grace: float) -> None:
        """Tell every worker to finish within ``grace``, wait for them, kill stragglers."""
        self._stopping = True
        if self._liveness is not None:
            self._liveness.cancel()
        for task in list(self._restarts):
            task.cancel()
        live = [(h, h.current) for h in self.handles if h.current is not None and h.current.alive]
        for handle, inc in live:
            try:
                inc.send(handle.rank, pack(Stop(grace)))
            except (WorkerDied, NotReady):
                inc.process.terminate()  # not listening yet
        deadline = time.monotonic() + grace + 5
        while any(inc.process.is_alive() for _, inc in live) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for handle, inc in live:
            if inc.process.is_alive():
                log.warning("rank %d: worker pid %d did not stop in time; killing it", handle.rank, inc.pid)
                inc.process.kill()
                await asyncio.to_thread(inc.process.join, 5)
        # Let the sentinel callbacks and their reaping run, then release whatever they did not.
        await asyncio.sleep(0)
        if self._restarts:
            await asyncio.wait(list(self._restarts), timeout=2)
        for handle in self.handles:
            if handle.current is not None:
                if self._loop is not None:
                    self._loop.remove_reader(handle.current.process.sentinel)
                handle.current.close()
            handle.state = RankState.STOPPED
