"""One data-parallel worker process: an :class:`EncoderRuntime` behind the front's IPC sockets.

Started by the front with the ``spawn`` method (never ``fork``: a forked CUDA or OpenMP runtime
is undefined behaviour). Its only argument is a JSON string, so nothing rich is pickled; device
pinning (``CUDA_VISIBLE_DEVICES``) and thread counts are set before torch is imported.

The worker reads typed messages from its own inbox and pushes answers, plus a heartbeat with its
state, load progress, typed report (``encoder_pod.facts``) and metric families, to the front's
shared results socket. Embeddings for prefill servers leave through the runtime's transfer
backends, straight from here.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import zmq
import zmq.asyncio

from encoder_pod.errors import EncoderError, InternalError, NotReady
from encoder_pod.exitcodes import ExitCode
from encoder_pod.metrics import ReplicaMetrics
from encoder_pod.parallel.messages import (
    Call,
    Cancel,
    START_PROFILE,
    STOP_PROFILE,
    Encode,
    Error,
    Frame,
    Message,
    ProtocolError,
    Result,
    Status,
    Stop,
    WorkerSpec,
    pack,
    request_from_wire,
    unpack,
)
from encoder_pod.parallel.ranked_metrics import sample_families
from encoder_pod.readiness import STALE_HEARTBEAT_S, LoadStep, ReplicaState
from encoder_pod.settings import EncoderSettings
from encoder_pod.transfer.inline import InlineAnswer

if TYPE_CHECKING:
    from encoder_pod.parallel.tensor.group import TensorParallelGroup
    from encoder_pod.runtime import EncoderRuntime

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.5
"""How often a worker reports its state and metrics (the freshness of /metrics and /server_info)."""

SEND_LINGER_MS = 2000
"""On exit, how long queued answers may take to reach the front before they are dropped."""


def run_worker(spec_json: str) -> None:
    """Entry point of the spawned process."""
    spec = WorkerSpec.from_json(spec_json)
    os.environ.update(spec.env)  # before anything imports torch
    # Ctrl-C in a terminal reaches the whole process group; the front decides how workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    settings = EncoderSettings.model_validate_json(spec.settings_json)
    logging.basicConfig(
        level=settings.observability.log_level.upper(),
        format=f"%(asctime)s %(levelname)s [rank {spec.rank}] %(name)s: %(message)s",
        force=True,
    )
    sys.exit(asyncio.run(WorkerServer(spec, settings).run()))


class WorkerServer:
    """The worker's event loop: inbox -> runtime -> results socket."""

    def __init__(self, spec: WorkerSpec, settings: EncoderSettings) -> None:
        self.spec = spec
        self.settings = settings
        self.runtime: EncoderRuntime | None = None
        """Made once torch and the model stack are imported."""
        self.group: TensorParallelGroup | None = None
        """With --tp-size > 1: the group this process is rank 0 of."""
        self._started = time.monotonic()
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._stop_grace: float | None = None
        self._stop = asyncio.Event()
        self._draining: asyncio.Future[None] | None = None
        # Sockets are made in run(), on the loop that uses them.
        self._ctx: zmq.asyncio.Context
        self._inbox: zmq.asyncio.Socket
        self._out: zmq.asyncio.Socket

    # --- lifecycle ------------------------------------------------------------------------
    async def run(self) -> int:
        """Load, serve until told to stop; returns the process exit code."""
        self._ctx = zmq.asyncio.Context()
        self._inbox = self._ctx.socket(zmq.PULL)
        self._out = self._ctx.socket(zmq.PUSH)
        self._out.setsockopt(zmq.LINGER, SEND_LINGER_MS)
        self._out.connect(self.spec.results)
        self._inbox.connect(self.spec.inbox)
        loop = asyncio.get_running_loop()
        self._watch_parent(loop)
        loop.add_signal_handler(signal.SIGTERM, self._on_sigterm)
        background = [asyncio.create_task(self._recv_loop()), asyncio.create_task(self._heartbeat_loop())]
        try:
            return await self._serve()
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            self._inbox.close(0)
            self._out.close()
            self._ctx.term()

    def _make_runtime(self) -> EncoderRuntime:
        """Import torch and the model stack (seconds: call on a thread) and build the runtime."""
        from encoder_pod.runtime import EncoderRuntime

        if self.settings.parallel.tp_size == 1:
            return EncoderRuntime(self.settings, ReplicaMetrics())
        from encoder_pod.parallel.tensor.group import TensorParallelGroup

        self.group = TensorParallelGroup(self.settings, label=f"dp{self.spec.rank}")
        # The group's loader starts the followers; its profiler reaches every rank of the group.
        return EncoderRuntime(
            self.settings, ReplicaMetrics(), adapter_loader=self.group.load_adapter, profiler=self.group.profiler
        )

    async def _serve(self) -> int:
        # On a thread, so heartbeats keep flowing while the ML stack imports.
        runtime = self.runtime = await asyncio.to_thread(self._make_runtime)
        await runtime.start()
        loaded = asyncio.create_task(runtime.wait_loaded())
        stop = asyncio.create_task(self._stop.wait())
        await asyncio.wait({loaded, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not loaded.done():
            loaded.cancel()
            await self._shutdown()
            return ExitCode.OK
        if loaded.result() is ReplicaState.FAILED:
            await self._send(self._status())  # the error and whether it is a refusal, before the exit
            stop.cancel()
            return ExitCode.MODEL_LOAD_FAILED  # the front counts a failed start (or gives a refusal up), not a crash
        await self._send(self._status())
        await stop
        await self._shutdown()
        return ExitCode.OK

    async def _shutdown(self) -> None:
        grace = self._stop_grace if self._stop_grace is not None else self.settings.admission.req_timeout
        if self.runtime is not None:
            await self.runtime.shutdown(grace)
        if self.group is not None:
            await asyncio.to_thread(self.group.close)  # after the runtime: no forward is running now
        # Started requests were answered or failed by the runtime; let their answers be sent.
        if self._tasks:
            await asyncio.wait(list(self._tasks.values()), timeout=5)
        await self._send(self._status())

    def _watch_parent(self, loop: asyncio.AbstractEventLoop) -> None:
        parent = multiprocessing.parent_process()
        if parent is None:
            return

        def orphaned() -> None:
            # The front is gone (SIGKILL, OOM): no one can receive an answer. Threads may be in a
            # forward, so a clean interpreter exit could hang; leave at once.
            log.error("front process died; worker exits")
            os._exit(ExitCode.ORPHANED)

        loop.add_reader(parent.sentinel, orphaned)

    def _on_sigterm(self) -> None:
        """A SIGTERM sent to this worker alone (or to the whole process group): drain, then stop.

        The front sees the DRAINING state in the next heartbeat and routes nothing new here; what
        this worker holds finishes (within ENCODER_DRAIN_TIMEOUT) and is answered before it exits.
        """
        if self._draining is not None:
            return
        log.info("SIGTERM: draining")
        self._draining = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        if self.runtime is not None:
            self.runtime.begin_drain()
            await self.runtime.wait_idle(self.settings.drain_timeout_s())
        self._stop.set()

    # --- messages ---------------------------------------------------------------------------
    async def _send(self, msg: Message, *frames: Frame) -> None:
        await self._out.send_multipart(pack(msg, *frames), copy=False)

    async def _recv_loop(self) -> None:
        while True:
            frames = await self._inbox.recv_multipart()
            try:
                msg, extra = unpack(frames)
            except ProtocolError as exc:
                log.error("dropped a malformed message from the front: %s", exc)
                continue
            self._dispatch(msg, extra)

    def _dispatch(self, msg: Message, extra: list[Frame]) -> None:
        if isinstance(msg, Encode):
            self._spawn(msg.call_id, self._encode(msg, extra))
        elif isinstance(msg, Call):
            self._spawn(msg.call_id, self._control(msg))
        elif isinstance(msg, Cancel):
            task = self._tasks.get(msg.call_id)
            if task is not None:
                task.cancel()
        elif isinstance(msg, Stop):
            self._stop_grace = msg.grace_s
            self._stop.set()
        else:
            log.error("unexpected %s message from the front", type(msg).__name__)

    def _spawn(self, call_id: int, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks[call_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(call_id, None))

    async def _answer(self, call_id: int, work: Callable[[], Awaitable[Any]], req_id: str | None = None) -> None:
        """Run ``work`` and send its Result or typed Error; nothing is sent if the call was cancelled."""
        rank, gen = self.spec.rank, self.spec.generation
        try:
            answer = await work()
        except EncoderError as err:
            err.req_id = err.req_id or req_id
            await self._send(Error.of(rank, gen, call_id, err))
            return
        except asyncio.CancelledError:
            return  # the front gave up on this call (client gone, deadline): nobody waits
        except Exception as exc:  # noqa: BLE001 - a bug must still answer the caller, typed
            log.exception("call %d failed", call_id)
            await self._send(Error.of(rank, gen, call_id, InternalError(f"{type(exc).__name__}: {exc}", req_id=req_id)))
            return
        frames: list[Frame]
        try:
            if isinstance(answer, InlineAnswer):
                # The embedding's bytes travel as a frame of their own (zero-copy), never inside msgpack.
                meta, data = answer.to_wire()
                frames = pack(Result(rank, gen, call_id, inline=meta), data)
            else:
                frames = pack(Result(rank, gen, call_id, body=answer))
        except (TypeError, ValueError, OverflowError) as exc:
            failure = InternalError(f"answer cannot be sent to the front: {exc}", req_id=req_id)
            frames = pack(Error.of(rank, gen, call_id, failure))
        await self._out.send_multipart(frames, copy=False)

    async def _encode(self, msg: Encode, extra: list[Frame]) -> None:
        req_id = msg.request.get("req_id") if isinstance(msg.request, dict) else None

        async def work() -> InlineAnswer | None:
            if self.runtime is None:
                raise NotReady("model is still loading")
            return await self.runtime.encode_request(request_from_wire(msg.request, extra))

        await self._answer(msg.call_id, work, req_id if isinstance(req_id, str) else None)

    async def _control(self, msg: Call) -> None:
        async def work() -> Any:
            if self.runtime is None:
                raise NotReady("model is still loading")
            if msg.op == START_PROFILE:
                return await self.runtime.start_profile(msg.args)
            if msg.op == STOP_PROFILE:
                return await self.runtime.stop_profile()
            # A transfer backend's operation by name: one the registry does not declare is an
            # UnknownControlOp (500) from the runtime's transfer router, never another operation.
            return await self.runtime.control(msg.op, msg.args)

        await self._answer(msg.call_id, work)

    # --- heartbeat ----------------------------------------------------------------------------
    def _status(self) -> Status:
        rt = self.runtime
        state: ReplicaState = ReplicaState.LOADING
        step: LoadStep | None = LoadStep.IMPORTING
        report = metrics = error = None
        refused = False
        health_error: str | None = "model is still loading"
        if rt is not None:
            state, step, error, refused = rt.state, rt.step, rt.load_error, rt.load_refused
            report = rt.report()
            metrics = sample_families(rt.metric_families())
            not_ready = rt.not_ready()
            health_error = not_ready.message if not_ready is not None else None
        silent = self.group.silent_followers(STALE_HEARTBEAT_S) if self.group is not None else []
        if silent:
            health_error = "; ".join(f"tensor-parallel rank {r} sent no heartbeat for {s:.1f}s" for r, s in silent)
        return Status(
            rank=self.spec.rank,
            generation=self.spec.generation,
            pid=os.getpid(),
            state=state,
            step=step,
            elapsed_s=round(time.monotonic() - self._started, 3),
            error=error,
            report=report,
            metrics=metrics,
            healthy=health_error is None,
            health_error=health_error,
            stalled=bool(silent),
            refused=refused,
        )

    async def _heartbeat_loop(self) -> None:
        while True:
            await self._send(self._status())
            await asyncio.sleep(HEARTBEAT_S)
