"""The data-parallel front: the Engine the HTTP edge drives when ``--dp-size`` is above 1.

It validates (the body parser), admits (:class:`~encoder_pod.batching.admission.Admission`: 409,
429, the same bound as a single process), routes to the least pending ready worker and answers;
it never imports torch and never runs model work. Packing a request (its items go as raw frames)
runs on an offload thread, and an inline answer comes back as a typed
:class:`~encoder_pod.transfer.inline.InlineAnswer` whose raw data frame is never copied here (the
HTTP edge renders it as the caller asked; base64 for JSON on a thread), so the event loop stays
free for /health while the workers are busy. Sends never block (a bound PUSH with no peer refuses
at once) and every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from enum import Enum
from typing import Any, Callable, Iterator, Sequence

import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry

from encoder_pod.batching.admission import Admission
from encoder_pod.errors import (
    DRAINING_MESSAGE,
    Draining,
    EncoderError,
    InvalidRequest,
    ModelLoadFailed,
    NotReady,
    RequestTimeout,
    ShuttingDown,
    WorkerDied,
)
from encoder_pod.metrics import render
from encoder_pod.facts import ModelFacts, ReplicaReport
from encoder_pod.offload import Offload
from encoder_pod.parallel.affinity import ReqAffinity
from encoder_pod.parallel.calls import Calls
from encoder_pod.parallel.handle import RankState, WorkerRecord
from encoder_pod.parallel.ipc import IpcDir
from encoder_pod.parallel.key_routing import KeyRouting, pod_cache_info, request_keys
from encoder_pod.parallel.messages import (
    START_PROFILE,
    STOP_PROFILE,
    Error,
    Frame,
    Message,
    MetricFamily,
    ProtocolError,
    Result,
    Status,
    encode_frames,
    unpack,
)
from encoder_pod.parallel.placement import plan, usable_cpus
from encoder_pod.parallel.ranked_metrics import DataParallelMetrics, RankedWorkerMetrics
from encoder_pod.parallel.router import NoWorker, Router
from encoder_pod.parallel.supervisor import Supervisor
from encoder_pod.parallel.tensor.plans import check_divisible
from encoder_pod.protocol import EncodeRequest, parse_encode_request
from encoder_pod.readiness import STALE_HEARTBEAT_S
from encoder_pod.settings import EncoderSettings, TransferBackend, model_dir
from encoder_pod.transfer.inline import InlineAnswer
from encoder_pod.transfer.registry import control_op

log = logging.getLogger(__name__)

BACKSTOP_S = 2.0
"""Past the request deadline, how long the front waits for the worker's own typed 504."""


class FrontState(str, Enum):
    """The pod as a whole, in /server_info."""

    LOADING = "loading"
    READY = "ready"
    DEGRADED = "degraded"
    FAILED = "failed"
    """A rank was given up; the pod stops (exit code 3) unless nothing is told (a front built alone)."""
    DRAINING = "draining"
    STOPPING = "stopping"


class DataParallelFront:
    """Routes /encode over ``dp_size`` worker processes, each one model replica."""

    def __init__(self, settings: EncoderSettings, on_load_failed: Callable[[ModelLoadFailed], None] | None = None) -> None:
        """``on_load_failed``: called once (on the event loop) when a rank is given up, its load having
        refused the checkpoint or failed ENCODER_DP_MAX_FAILED_STARTS starts in a row: the pod's
        server stops (this front with it) and exits ``MODEL_LOAD_FAILED``. Without it the front
        stays up, failed."""
        parallel = settings.parallel
        if parallel.tp_size > 1:
            # Before any worker starts: a model that cannot be split stops the pod with the reason
            # instead of crash-looping its groups.
            check_divisible(json.loads((model_dir(settings.model) / "config.json").read_text()), parallel.tp_size)
        self.settings = settings
        self._registry = CollectorRegistry()
        self._dp_metrics = DataParallelMetrics(self._registry)
        self._registry.register(RankedWorkerMetrics(self._worker_metrics))
        self._placements = plan(settings.parallel, settings.model, os.environ, usable_cpus())
        if settings.parallel.dp_worker_max_inflight < settings.batching.max_batch_size:
            log.warning(
                "ENCODER_DP_WORKER_MAX_INFLIGHT=%d is below ENCODER_MAX_BATCH_SIZE=%d: a worker never "
                "holds enough requests to fill a batch",
                settings.parallel.dp_worker_max_inflight, settings.batching.max_batch_size,
            )
        self._router = Router(settings.parallel.dp_size, settings.parallel.dp_worker_max_inflight)
        # Backends where prefill ranks call back about a req_id (receive URLs, mooncake pulls): same worker.
        self._sticky = settings.transfer.transfer_backend not in (TransferBackend.INLINE, TransferBackend.ZMQ_TO_TOKENIZER)
        admission = settings.admission
        self._affinity = ReqAffinity(4 * admission.max_queue, admission.req_timeout + settings.transfer.send_timeout)
        self._admission = Admission(admission.max_queue)
        self._calls = Calls(admission.req_timeout)
        self._keys = KeyRouting(self._registry) if settings.cache.cache_size_mb else None
        self._offload = Offload(name="front-offload")
        self._on_load_failed = on_load_failed
        self._load_failure: ModelLoadFailed | None = None
        self._draining = False
        self._stopping = False
        self._ipc: IpcDir | None = None
        self._zctx: zmq.asyncio.Context | None = None
        self._results: zmq.asyncio.Socket | None = None
        self._supervisor: Supervisor | None = None
        self._recv_task: asyncio.Task[None] | None = None
        self.started_at = time.time()

    @property
    def registry(self) -> CollectorRegistry:
        """The front's registry (the HTTP edge's and the ``encoder_dp_*`` families)."""
        return self._registry

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind the IPC sockets and spawn the workers; returns before any model is loaded."""
        self._ipc = IpcDir()
        self._zctx = zmq.asyncio.Context()
        self._results = self._zctx.socket(zmq.PULL)
        self._results.setsockopt(zmq.LINGER, 0)
        self._results.bind(self._ipc.results)
        self._supervisor = Supervisor(
            self.settings, self._placements, self._ipc, self._zctx, self._router, self._dp_metrics, self._on_rank_down,
            self._on_given_up,
        )
        self._recv_task = asyncio.create_task(self._recv_loop(), name="dp-results")
        self._supervisor.start_all()
        log.info(
            "data-parallel front: %d workers (tensor-parallel groups of %d ranks), IPC in %s",
            self.settings.parallel.dp_size, self.settings.parallel.tp_size, self._ipc.path,
        )

    def begin_drain(self) -> None:
        """The pod drains (``encoder_pod.drain``): ``/server_info`` says so; admitted requests, waiting
        for a worker slot or held by a worker, go on. New ones are refused at the faces. The
        workers are not told: they finish what they hold and stop when :meth:`shutdown` says so."""
        if self._draining:
            return
        self._draining = True
        log.info("draining: %d admitted requests finish", self._admission.in_flight)

    async def shutdown(self, grace: float = 10.0) -> None:
        """Stop: requests still waiting for a worker get 503, workers finish within ``grace`` and
        exit, the IPC files are removed."""
        self._stopping = True
        self._admission.close()
        waiting = self._router.fail_waiters(NoWorker)
        if waiting:
            log.info("stopping: %d requests waiting for a worker answered 503", waiting)
        if self._supervisor is not None:
            await self._supervisor.stop(grace)
        if self._recv_task is not None:
            self._recv_task.cancel()
            await asyncio.gather(self._recv_task, return_exceptions=True)
        if self._results is not None:
            self._results.close(0)
        if self._zctx is not None:
            self._zctx.term()
        if self._ipc is not None:
            self._ipc.remove()
        self._offload.close()
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

    def _on_message(self, msg: Message, extra: list[Frame]) -> None:
        assert self._supervisor is not None
        if isinstance(msg, Status):
            self._supervisor.on_status(msg)
        elif isinstance(msg, (Result, Error)):
            self._calls.settle(self._supervisor.handles, msg, extra)
        else:
            raise ProtocolError(f"unexpected {type(msg).__name__} from a worker")

    def _on_rank_down(self, rank: int) -> None:
        if not self._router.any_ready:
            n = self._router.fail_waiters(NoWorker)
            if n:
                log.error("no worker is ready: %d waiting requests answered 503", n)

    def _on_given_up(self, rank: int, reason: str) -> None:
        """A rank will not start again: the pod cannot serve its model (the first such rank is named)."""
        if self._load_failure is not None or self._stopping:
            return
        self._load_failure = ModelLoadFailed(f"worker {rank}: {reason}")
        if self._on_load_failed is not None:
            log.error("stopping: %s", self._load_failure.message)
            self._on_load_failed(self._load_failure)

    # --- /encode ----------------------------------------------------------------------------
    def _handles(self) -> list[WorkerRecord]:
        if self._supervisor is None:
            raise NotReady("workers are not started yet")
        return self._supervisor.handles

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

    async def encode(self, body: object) -> InlineAnswer | None:
        """Validate, route to a worker, return its answer (the inline answer, or None once pushed)."""
        request = parse_encode_request(body)
        try:
            return await self._encode(request)
        except EncoderError as err:
            err.req_id = err.req_id or request.req_id
            raise

    async def _encode(self, request: EncodeRequest) -> InlineAnswer | None:
        if self._stopping or not self._router.any_ready:
            raise self._no_worker()
        async with self._admission.admit(request.req_id):
            call_id = self._calls.next_id()
            try:
                frames, keys = await self._offload.run(self._pack, call_id, request)
            except (TypeError, ValueError, OverflowError) as exc:  # a value msgpack cannot carry: the caller's
                raise InvalidRequest(f"request holds a value that cannot be forwarded to a worker ({exc})") from None
            result, extra = await self._route(request, call_id, frames, keys)
        if result.inline is None:
            return None
        try:
            return InlineAnswer.from_wire(result.inline, extra[0])
        except (ValueError, IndexError) as exc:
            raise ProtocolError(f"worker sent a malformed inline answer: {exc}") from None

    def _pack(self, call_id: int, request: EncodeRequest) -> tuple[list[Frame], list[bytes]]:
        """The request's frames and, with the cache on, its items' affinity keys (offload thread)."""
        return encode_frames(call_id, request), request_keys(request) if self._keys is not None else []

    async def _route(
        self, request: EncodeRequest, call_id: int, frames: list[Frame], keys: list[bytes]
    ) -> tuple[Result, list[Frame]]:
        """Take a slot on a worker (sticky for zmq_to_scheduler, else where its items are cached, else
        by load), call it, free the slot."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.admission.req_timeout
        bound = self._affinity.get(request.req_id) if self._sticky else None
        cached = self._keys.prefer(keys) if self._keys is not None and bound is None else None
        by_key = cached is not None and self._router.take_free(cached)
        if bound is not None and self._router.take(bound):
            rank = bound
        elif by_key and cached is not None:
            rank = cached
        else:
            rank = await self._acquire(deadline)
        if self._sticky:
            rank = self._affinity.settle(request.req_id, rank, self._router)
        if self._keys is not None:
            self._keys.record(keys, rank, by_key)
        try:
            self._dp_metrics.routed.labels(rank=str(rank)).inc()
            handle = self._handles()[rank]
            return await self._calls.call(handle, call_id, frames, deadline + BACKSTOP_S)
        finally:
            self._router.release(rank)

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

    # --- fan-out: health, profiling; transfer control ------------------------------------
    async def health(self) -> None:
        """503 unless every rank is ready, heard from within STALE_HEARTBEAT_S and its own verdict
        (a real tiny encode or live traffic, kept by the worker) is ready. From state only: this
        never calls a worker, so a hung one makes it 503 at once, not a timeout."""
        if self._stopping:
            raise ShuttingDown("server is shutting down")
        if self._draining:
            raise Draining(DRAINING_MESSAGE)
        handles = self._handles()
        now = time.monotonic()
        problems = [p for p in (self._rank_problem(h, now) for h in handles) if p is not None]
        if not problems:
            return
        if not any(h.state is RankState.READY for h in handles):
            raise self._no_worker()
        raise NotReady("; ".join(problems))

    def _rank_problem(self, handle: WorkerRecord, now: float) -> str | None:
        """Why this rank is not ready (None when it is)."""
        inc = handle.current
        if handle.state is not RankState.READY or inc is None:
            return f"worker {handle.rank} is {handle.state.value}"
        silent = now - inc.last_seen
        if silent > STALE_HEARTBEAT_S:
            return (
                f"worker {handle.rank} has sent no heartbeat for {silent:.1f}s (hung or stopped; killed at "
                f"{self.settings.parallel.dp_heartbeat_timeout:g}s, ENCODER_DP_HEARTBEAT_TIMEOUT)"
            )
        if not inc.healthy:
            return f"worker {handle.rank}: {inc.health_error or 'not ready'}"
        return None

    async def _fan_out(self, op: str, args_of: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
        ready = [h for h in self._handles() if h.state is RankState.READY]
        if not ready:
            raise self._no_worker()
        timeout = self.settings.observability.health_timeout + 30
        answers = await asyncio.gather(
            *(self._calls.control(h, op, args_of(h.rank), timeout) for h in ready), return_exceptions=True
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
            START_PROFILE, lambda rank: {**options, "output_dir": os.path.join(base, f"rank-{rank}")}
        )

    async def stop_profile(self) -> dict[str, Any]:
        """Stop the profiler on every ready worker."""
        return await self._fan_out(STOP_PROFILE, lambda rank: {})

    async def control(self, op: str, payload: dict[str, Any]) -> Any:
        """A prefill rank's call back about a req_id (receive URLs, mooncake pulls) goes to the
        worker that runs (or will run, or ran) that request; one this pod's backend does not serve
        is refused here, with the operation's message."""
        declared = control_op(op)
        declared.check(self.settings.transfer.transfer_backend)  # past it, the backend is one of the sticky ones
        req_id = declared.req_id_of(payload)  # a malformed registration never reaches a worker
        return await self._to_owner(req_id, op, payload)

    async def _to_owner(self, req_id: str | None, op: str, payload: dict[str, Any]) -> Any:
        """A prefill rank's call about ``req_id`` goes to the worker bound to it (binding one if none is)."""
        rank = self._affinity.get(req_id) if req_id is not None else None
        if rank is None or not self._router.is_ready(rank):
            # Unbound (or no req_id to route by): any worker; its answer is the single-process one.
            rank = self._router.pick(full_ok=True)
            if rank is None:
                raise self._no_worker()
        if req_id is not None:
            self._affinity.bind(req_id, rank)
        return await self._calls.control(self._handles()[rank], op, payload, self.settings.transfer.send_timeout + 5)

    # --- metrics and info -------------------------------------------------------------------
    def metrics_text(self) -> bytes:
        """The front's registry: its own families and every live worker's (from its last heartbeat), by rank."""
        for rank, pending in enumerate(self._router.pending):
            self._dp_metrics.pending.labels(rank=str(rank)).set(pending)
        self._dp_metrics.waiting.set(self._router.waiting)
        return render(self._registry)

    def _worker_metrics(self) -> Iterator[tuple[int, Sequence[MetricFamily]]]:
        """Each live worker's families as its last heartbeat carried them (:class:`RankedWorkerMetrics`)."""
        for handle in self._supervisor.handles if self._supervisor else []:
            if handle.current is not None and handle.current.metrics:
                yield handle.rank, handle.current.metrics

    def _state(self, handles: list[WorkerRecord]) -> FrontState:
        if self._stopping:
            return FrontState.STOPPING
        if self._draining:
            return FrontState.DRAINING
        states = {h.state for h in handles}
        if RankState.FAILED in states:
            return FrontState.FAILED
        if states == {RankState.READY}:
            return FrontState.READY
        if all(h.state is RankState.STARTING and h.deaths == 0 for h in handles):
            return FrontState.LOADING
        return FrontState.DEGRADED

    def _reports(self) -> list[ReplicaReport]:
        """Each rank's last report of itself (ranks not heard from yet left out)."""
        handles = self._supervisor.handles if self._supervisor else []
        return [h.current.report for h in handles if h.current is not None and h.current.report is not None]

    def model_facts(self) -> ModelFacts | None:
        """The model the workers serve (every rank loads the same): the first that reported it."""
        return next((r.model for r in self._reports() if r.model is not None), None)

    def info(self) -> dict[str, Any]:
        """/server_info: the pod's state, then one entry per worker."""
        handles = self._supervisor.handles if self._supervisor else []
        workers = [h.describe(self._router) for h in handles]
        failed = [h for h in handles if h.state is RankState.FAILED or (h.last_error and h.state is not RankState.READY)]
        model = self.model_facts()
        reports = self._reports()
        return {
            "state": self._state(handles).value if handles else FrontState.LOADING.value,
            "load_error": (f"worker {failed[0].rank}: {failed[0].last_error or failed[0].last_exit}" if failed else None),
            "mode": "tensor_parallel" if self.settings.parallel.tp_size > 1 else "data_parallel",
            "dp_size": self.settings.parallel.dp_size,
            "tp_size": self.settings.parallel.tp_size,
            "model": model.to_json() if model is not None else None,
            "queue_depth": self._router.waiting + sum(r.queue_depth for r in reports),
            "inflight": self._admission.in_flight,
            "cache": pod_cache_info([r.cache for r in reports], self._keys),
            "uptime_s": round(time.time() - self.started_at, 3),
            "ipc_dir": str(self._ipc.path) if self._ipc else None,
            "workers": workers,
            "settings": self.settings.masked(),
        }
