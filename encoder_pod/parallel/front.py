"""The data-parallel front: the Engine the HTTP edge drives when ``--dp-size`` is above 1.

It validates (the body parser, duplicate req_id 409, admission 429), routes to the least
pending ready worker and answers; it never imports torch and never runs model work, so its event
loop stays free for /health while the workers are busy. Sends never block (a bound PUSH with no
peer refuses at once) and every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from enum import Enum
from typing import Any

import zmq
import zmq.asyncio

from encoder_pod.errors import (
    DuplicateRequest,
    EncoderError,
    InvalidRequest,
    NotReady,
    Overloaded,
    RequestTimeout,
    ShuttingDown,
    WorkerDied,
)
from encoder_pod.parallel.affinity import ReqAffinity
from encoder_pod.parallel.ipc import IpcDir
from encoder_pod.parallel.messages import (
    Call,
    Cancel,
    ControlOp,
    Drain,
    Encode,
    Error,
    Message,
    ProtocolError,
    Result,
    Status,
    pack,
    request_to_wire,
    unpack,
)
from encoder_pod.parallel.placement import plan, usable_cpus
from encoder_pod.parallel.ranked_metrics import DataParallelMetrics, edge_metrics, merge
from encoder_pod.parallel.router import NoWorker, Router
from encoder_pod.parallel.handle import RankState, WorkerHandle
from encoder_pod.parallel.supervisor import Supervisor
from encoder_pod.parallel.tensor.plans import check_divisible
from encoder_pod.protocol import EncodeRequest, parse_encode_request
from encoder_pod.readiness import HEALTH_SKIP_S
from encoder_pod.settings import EncoderSettings, TransferBackend, model_dir
from encoder_pod.transfer.receive_urls import parse_registration

log = logging.getLogger(__name__)

BACKSTOP_S = 2.0
"""Past the request deadline, how long the front waits for the worker's own typed 504."""
FRESH_HEARTBEAT_S = 2.0
"""A heartbeat this recent shows the rank's event loop is alive (they come every 0.5 s)."""


class FrontState(str, Enum):
    """The pod as a whole, in /server_info."""

    LOADING = "loading"
    READY = "ready"
    DEGRADED = "degraded"
    FAILED = "failed"
    STOPPING = "stopping"


class DataParallelFront:
    """Routes /encode over ``dp_size`` worker processes, each one model replica."""

    def __init__(self, settings: EncoderSettings) -> None:
        parallel = settings.parallel
        if parallel.tp_size > 1:
            # Before any worker starts: a model that cannot be split stops the pod with the reason
            # instead of crash-looping its groups.
            check_divisible(json.loads((model_dir(settings.model) / "config.json").read_text()), parallel.tp_size)
        self.settings = settings
        self.metrics = edge_metrics()
        self._dp_metrics = DataParallelMetrics(self.metrics)
        self._placements = plan(settings.parallel, settings.model, os.environ, usable_cpus())
        if settings.parallel.dp_worker_max_inflight < settings.batching.max_batch_size:
            log.warning(
                "ENCODER_DP_WORKER_MAX_INFLIGHT=%d is below ENCODER_MAX_BATCH_SIZE=%d: a worker never "
                "holds enough requests to fill a batch",
                settings.parallel.dp_worker_max_inflight, settings.batching.max_batch_size,
            )
        self._router = Router(settings.parallel.dp_size, settings.parallel.dp_worker_max_inflight)
        self._sticky = settings.transfer.encoder_transfer_backend is TransferBackend.ZMQ_TO_SCHEDULER
        admission = settings.admission
        self._affinity = ReqAffinity(4 * admission.max_queue, admission.req_timeout + settings.transfer.send_timeout)
        self._inflight: set[str] = set()
        self._admitted = 0
        self._stopping = False
        self._call_ids = itertools.count(1)
        self._ipc: IpcDir | None = None
        self._zctx: zmq.asyncio.Context | None = None
        self._results: zmq.asyncio.Socket | None = None
        self._supervisor: Supervisor | None = None
        self._recv_task: asyncio.Task[None] | None = None
        self.started_at = time.time()

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind the IPC sockets and spawn the workers; returns before any model is loaded."""
        self._ipc = IpcDir()
        self._zctx = zmq.asyncio.Context()
        self._results = self._zctx.socket(zmq.PULL)
        self._results.setsockopt(zmq.LINGER, 0)
        self._results.bind(self._ipc.results)
        self._supervisor = Supervisor(
            self.settings, self._placements, self._ipc, self._zctx, self._router, self._dp_metrics, self._on_rank_down
        )
        self._recv_task = asyncio.create_task(self._recv_loop(), name="dp-results")
        self._supervisor.start_all()
        log.info(
            "data-parallel front: %d workers (tensor-parallel groups of %d ranks), IPC in %s",
            self.settings.parallel.dp_size, self.settings.parallel.tp_size, self._ipc.path,
        )

    def begin_shutdown(self) -> None:
        """Stop admitting; waiting requests and every worker's queued ones get 503. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        waiting = self._router.fail_waiters(NoWorker)
        if self._supervisor is not None:
            self._supervisor.broadcast(pack(Drain()))
        log.info("shutting down: %d requests waiting for a worker answered 503; workers draining", waiting)

    async def shutdown(self, grace: float = 10.0) -> None:
        """Let in-flight requests finish within ``grace``, stop the workers, remove the IPC files."""
        self.begin_shutdown()
        deadline = time.monotonic() + grace
        while self._admitted and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._supervisor is not None:
            await self._supervisor.stop(max(1.0, deadline - time.monotonic()))
        if self._recv_task is not None:
            self._recv_task.cancel()
            await asyncio.gather(self._recv_task, return_exceptions=True)
        if self._results is not None:
            self._results.close(0)
        if self._zctx is not None:
            self._zctx.term()
        if self._ipc is not None:
            self._ipc.remove()
        log.info("data-parallel front stopped")

    # --- results from the workers ---------------------------------------------------------
    async def _recv_loop(self) -> None:
        assert self._results is not None
        while True:
            frames = await self._results.recv_multipart(copy=False)
            try:
                msg, extra = unpack([frames[0].bytes, *(f.buffer for f in frames[1:])])
                self._on_message(msg, extra)
            except ProtocolError as exc:
                log.error("dropped a malformed message from a worker: %s", exc)
            except Exception:  # noqa: BLE001 - one bad message must not stop every answer
                log.exception("failed to handle a worker message")

    def _on_message(self, msg: Message, extra: list[Any]) -> None:
        assert self._supervisor is not None
        if isinstance(msg, Status):
            self._supervisor.on_status(msg)
            return
        if not isinstance(msg, (Result, Error)):
            raise ProtocolError(f"unexpected {type(msg).__name__} from a worker")
        if not 0 <= msg.rank < len(self._supervisor.handles):
            raise ProtocolError(f"answer from unknown rank {msg.rank}")
        handle = self._supervisor.handles[msg.rank]
        if msg.generation != handle.generation:
            return  # answered by an incarnation already declared dead: its caller got 503
        future = handle.calls.pop(msg.call_id, None)
        if future is None or future.done():
            return  # the caller gave up (timeout, disconnect)
        if isinstance(msg, Error):
            future.set_exception(msg.to_exception())
        else:
            future.set_result((msg, extra))

    def _on_rank_down(self, rank: int) -> None:
        if not self._router.any_ready:
            n = self._router.fail_waiters(NoWorker)
            if n:
                log.error("no worker is ready: %d waiting requests answered 503", n)

    # --- calls ------------------------------------------------------------------------------
    async def _call(self, handle: WorkerHandle, call_id: int, frames: list[bytes], deadline: float) -> tuple[Result, list[Any]]:
        """Send a packed call to ``handle`` and wait for its answer until ``deadline`` (loop time)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[Result, list[Any]]] = loop.create_future()
        handle.calls[call_id] = future
        try:
            handle.send(frames)
            return await asyncio.wait_for(future, max(0.0, deadline - loop.time()))
        except TimeoutError:
            self._cancel(handle, call_id)
            raise RequestTimeout(
                f"worker {handle.rank} did not answer within {self.settings.admission.req_timeout}s (ENCODER_REQ_TIMEOUT)"
            ) from None
        except asyncio.CancelledError:
            self._cancel(handle, call_id)  # the client is gone: the worker drops the work
            raise
        finally:
            handle.calls.pop(call_id, None)

    @staticmethod
    def _cancel(handle: WorkerHandle, call_id: int) -> None:
        try:
            handle.send(pack(Cancel(call_id)))
        except EncoderError:
            pass  # the worker is gone; so is the work

    async def _control(self, handle: WorkerHandle, op: ControlOp, args: dict[str, Any], timeout: float) -> Any:
        msg = Call(next(self._call_ids), op, args)
        try:
            frames = pack(msg)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidRequest(f"body holds a value that cannot be forwarded to a worker ({exc})") from None
        result, _ = await self._call(handle, msg.call_id, frames, asyncio.get_running_loop().time() + timeout)
        return result.body

    def _handles(self) -> list[WorkerHandle]:
        if self._supervisor is None:
            raise NotReady("workers are not started yet")
        return self._supervisor.handles

    # --- /encode ----------------------------------------------------------------------------
    def _no_worker(self) -> EncoderError:
        """The 503 for "no rank takes traffic", saying why."""
        if self._stopping:
            return ShuttingDown("server is shutting down")
        handles = self._handles()
        failed = [h for h in handles if h.state is RankState.FAILED]
        if failed:
            return NotReady(f"worker {failed[0].rank} failed to load: {failed[0].last_error or failed[0].last_exit}")
        if all(h.state is RankState.STARTING and h.deaths == 0 for h in handles):
            return NotReady("model is still loading")
        states = ", ".join(f"rank {h.rank} {h.state.value}" for h in handles)
        return WorkerDied(f"all workers are dead or restarting ({states})")

    async def encode(self, body: Any) -> Any:
        """Validate, route to a worker, return its answer (the inline body or null)."""
        request = parse_encode_request(body)
        try:
            return await self._encode(request)
        except EncoderError as err:
            err.req_id = err.req_id or request.req_id
            raise

    async def _encode(self, request: EncodeRequest) -> Any:
        if self._stopping or not self._router.any_ready:
            raise self._no_worker()
        if request.req_id in self._inflight:
            raise DuplicateRequest(f"req_id {request.req_id!r} is already in flight")
        if self._admitted >= self.settings.admission.max_queue:
            raise Overloaded(f"queue is full ({self.settings.admission.max_queue} requests waiting); retry later")
        msg = Encode(next(self._call_ids), request_to_wire(request))
        try:
            frames = pack(msg)  # before admission: a value msgpack cannot carry is the caller's fault
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidRequest(f"request holds a value that cannot be forwarded to a worker ({exc})") from None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.admission.req_timeout
        self._inflight.add(request.req_id)
        self._admitted += 1
        try:
            bound = self._affinity.get(request.req_id) if self._sticky else None
            rank = bound if bound is not None and self._router.take(bound) else await self._acquire(deadline)
            if self._sticky:
                self._affinity.bind(request.req_id, rank)
            try:
                self._dp_metrics.routed.labels(rank=str(rank)).inc()
                handle = self._handles()[rank]
                result, extra = await self._call(handle, msg.call_id, frames, deadline + BACKSTOP_S)
                handle.last_success = time.monotonic()
            finally:
                self._router.release(rank)
        finally:
            self._inflight.discard(request.req_id)
            self._admitted -= 1
        body = result.body
        if result.framed:
            # Frame 1 is the base64 the worker made; the body gets it back as is.
            body["embedding"]["data"] = str(extra[0], "ascii")
        return body

    async def _acquire(self, deadline: float) -> int:
        try:
            return await asyncio.wait_for(self._router.acquire(), max(0.0, deadline - asyncio.get_running_loop().time()))
        except NoWorker:
            raise self._no_worker() from None
        except TimeoutError:
            raise RequestTimeout(
                f"no worker slot freed within {self.settings.admission.req_timeout}s (ENCODER_REQ_TIMEOUT); "
                f"every worker holds ENCODER_DP_WORKER_MAX_INFLIGHT={self.settings.parallel.dp_worker_max_inflight}"
            ) from None

    # --- fan-out: health, profiling, receive URLs -------------------------------------------
    async def health(self) -> None:
        """503 unless every rank is ready and passes its own probe (a real tiny encode)."""
        if self._stopping:
            raise ShuttingDown("server is shutting down")
        handles = self._handles()
        down = [h for h in handles if h.state is not RankState.READY]
        if down:
            if not self._router.any_ready:
                raise self._no_worker()
            raise NotReady("; ".join(f"worker {h.rank} is {h.state.value}" for h in down))
        now = time.monotonic()
        if all(now - h.last_success < HEALTH_SKIP_S and now - h.last_seen < FRESH_HEARTBEAT_S for h in handles):
            return  # live traffic just proved every rank; a probe would only queue behind it
        timeout = self.settings.observability.health_timeout + 1
        answers = await asyncio.gather(
            *(self._control(h, ControlOp.HEALTH, {}, timeout) for h in handles), return_exceptions=True
        )
        failures = [(h.rank, a) for h, a in zip(handles, answers) if isinstance(a, BaseException)]
        if failures:
            raise NotReady("; ".join(f"worker {rank}: {getattr(err, 'message', err)}" for rank, err in failures))

    async def _fan_out(self, op: ControlOp, args_of: Any) -> dict[str, Any]:
        ready = [h for h in self._handles() if h.state is RankState.READY]
        if not ready:
            raise self._no_worker()
        timeout = self.settings.observability.health_timeout + 30
        answers = await asyncio.gather(
            *(self._control(h, op, args_of(h.rank), timeout) for h in ready), return_exceptions=True
        )
        for handle, answer in zip(ready, answers):
            if isinstance(answer, EncoderError):
                answer.message = f"worker {handle.rank}: {answer.message}"
                raise answer
            if isinstance(answer, BaseException):
                raise answer
        skipped = [h.rank for h in self._handles() if h.state is not RankState.READY]
        return {"status": "ok", "ranks": {str(h.rank): a for h, a in zip(ready, answers)}, "skipped_ranks": skipped}

    async def start_profile(self, options: dict[str, Any]) -> dict[str, Any]:
        """Start the profiler on every ready worker; each writes under ``<output_dir>/rank-<N>``."""
        base = options.get("output_dir") or "/tmp/encoder-profiles"
        if not isinstance(base, str):
            raise InvalidRequest("field 'output_dir': must be a path")
        return await self._fan_out(
            ControlOp.START_PROFILE, lambda rank: {**options, "output_dir": os.path.join(base, f"rank-{rank}")}
        )

    async def stop_profile(self) -> dict[str, Any]:
        """Stop the profiler on every ready worker."""
        return await self._fan_out(ControlOp.STOP_PROFILE, lambda rank: {})

    async def register_receive_url(self, payload: dict[str, Any]) -> None:
        """Hand a receive URL to the worker that runs (or will run, or ran) its request."""
        if not self._sticky:
            # Not a zmq_to_scheduler pod: any worker refuses it with the single-process message.
            rank = self._router.pick(full_ok=True)
            if rank is None:
                raise self._no_worker()
            await self._control(self._handles()[rank], ControlOp.RECEIVE_URL, payload, self.settings.transfer.send_timeout)
            return
        registration = parse_registration(payload)  # a malformed body never reaches a worker
        rank = self._affinity.get(registration.req_id)
        if rank is None or not self._router.is_ready(rank):
            rank = self._router.pick(full_ok=True)
            if rank is None:
                raise self._no_worker()
        self._affinity.bind(registration.req_id, rank)
        await self._control(self._handles()[rank], ControlOp.RECEIVE_URL, payload, self.settings.transfer.send_timeout)

    # --- metrics and info -------------------------------------------------------------------
    def metrics_text(self) -> bytes:
        """The front's families, then every live worker's (from its last heartbeat), by rank."""
        for rank, pending in enumerate(self._router.pending):
            self._dp_metrics.pending.labels(rank=str(rank)).set(pending)
        self._dp_metrics.waiting.set(self._router.waiting)
        handles = self._supervisor.handles if self._supervisor else []
        return merge(self.metrics.render(), [(h.rank, h.metrics) for h in handles if h.metrics])

    def _state(self, handles: list[WorkerHandle]) -> FrontState:
        if self._stopping:
            return FrontState.STOPPING
        states = {h.state for h in handles}
        if RankState.FAILED in states:
            return FrontState.FAILED
        if states == {RankState.READY}:
            return FrontState.READY
        if all(h.state is RankState.STARTING and h.deaths == 0 for h in handles):
            return FrontState.LOADING
        return FrontState.DEGRADED

    def info(self) -> dict[str, Any]:
        """/server_info: the pod's state, then one entry per worker."""
        handles = self._supervisor.handles if self._supervisor else []
        workers = [h.describe(self._router) for h in handles]
        failed = [h for h in handles if h.state is RankState.FAILED or (h.last_error and h.state is not RankState.READY)]
        model = next((w["model"] for w in workers if w["model"]), None)
        return {
            "state": self._state(handles).value if handles else FrontState.LOADING.value,
            "load_error": (f"worker {failed[0].rank}: {failed[0].last_error or failed[0].last_exit}" if failed else None),
            "mode": "tensor_parallel" if self.settings.parallel.tp_size > 1 else "data_parallel",
            "dp_size": self.settings.parallel.dp_size,
            "tp_size": self.settings.parallel.tp_size,
            "model": model,
            "queue_depth": self._router.waiting + sum(w["queue_depth"] for w in workers),
            "inflight": len(self._inflight),
            "uptime_s": round(time.time() - self.started_at, 3),
            "ipc_dir": str(self._ipc.path) if self._ipc else None,
            "workers": workers,
            "settings": self.settings.masked(),
        }
