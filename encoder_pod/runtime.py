"""The protocol-neutral encoder runtime: one model replica, its batcher, media loading and transfer.

No HTTP here: the HTTP server (single process) and the data-parallel worker (behind IPC) both
drive this class, so another transport can reuse it without importing the web stack.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from typing import Any, Callable

from encoder_pod.batching.entry import PendingEntry
from encoder_pod.batching.scheduler import BatchScheduler
from encoder_pod.errors import (
    DuplicateRequest,
    EncoderError,
    InternalError,
    InvalidRequest,
    ItemError,
    MediaError,
    NotReady,
    Overloaded,
    RequestTimeout,
    ShuttingDown,
)
from encoder_pod.media.decode import decode_item
from encoder_pod.media.sources import MediaSources
from encoder_pod.metrics import EncoderMetrics
from encoder_pod.models.base import EncodedPart, EncoderAdapter, MediaItem
from encoder_pod.models.registry import AdapterLoader, load_adapter
from encoder_pod.profiling import Profiler, TorchProfiler
from encoder_pod.protocol import EncodeRequest, ItemSpec, parse_encode_request
from encoder_pod.readiness import SuccessClock
from encoder_pod.settings import EncoderSettings
from encoder_pod.transfer.base import Transfer
from encoder_pod.transfer.router import TransferRouter

log = logging.getLogger(__name__)

class State(str, Enum):
    """Life of a runtime."""

    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPING = "stopping"


class EncoderRuntime:
    """Everything one model replica needs to answer /encode, minus the transport."""

    def __init__(
        self,
        settings: EncoderSettings,
        metrics: EncoderMetrics | None = None,
        *,
        adapter_loader: AdapterLoader = load_adapter,
        transfer: TransferRouter | None = None,
        profiler: Profiler | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or EncoderMetrics()
        self.state = State.LOADING
        self.load_error: str | None = None
        self.adapter: EncoderAdapter | None = None
        self._loader = adapter_loader
        self._transfer = transfer or TransferRouter(settings.transfer, max_registrations=settings.admission.max_queue)
        self._scheduler: BatchScheduler | None = None
        self._media_exec = ThreadPoolExecutor(settings.media.mm_load_workers, thread_name_prefix="media")
        self._sources = MediaSources(settings.media, max_bytes=settings.server.max_request_bytes)
        self._profiler: Profiler = profiler or TorchProfiler()  # a tensor-parallel group passes one that reaches every rank
        self._inflight: set[str] = set()
        self._admitted = 0
        self._success = SuccessClock()
        self._health_task: asyncio.Task[None] | None = None
        self._load_task: asyncio.Task[None] | None = None
        self.started_at = time.time()

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Begin loading the model in the background; requests get 503 until it is ready."""
        self._load_task = asyncio.create_task(self._load(), name="model-load")

    async def wait_loaded(self) -> State:
        """Wait for the load to finish either way (tests, workers reporting ready)."""
        if self._load_task is not None:
            await asyncio.shield(self._load_task)
        return self.state

    async def _load(self) -> None:
        started = time.perf_counter()
        try:
            if self.settings.model.num_threads:
                import torch

                torch.set_num_threads(self.settings.model.num_threads)
            adapter = await asyncio.to_thread(self._loader, self.settings.model)
            await asyncio.to_thread(adapter.warmup)
        except Exception as exc:  # noqa: BLE001 - any load failure is reported, never raised
            self.state, self.load_error = State.FAILED, f"{type(exc).__name__}: {exc}"
            log.error("model load failed: %s", self.load_error)
            return
        self.adapter = adapter
        self._scheduler = BatchScheduler(adapter, self.settings.batching, self.metrics, on_forward=self._profiler.step)
        self._scheduler.start()
        if self.state is State.LOADING:
            self.state = State.READY
        log.info("encoder ready (%s) in %.1fs", adapter.name, time.perf_counter() - started)

    def begin_shutdown(self) -> None:
        """Stop admitting and answer every request that has not started (503). Idempotent."""
        if self.state is State.STOPPING:
            return
        self.state = State.STOPPING
        if self._scheduler is not None:
            n = self._scheduler.fail_waiting(ShuttingDown("server is shutting down"))
            log.info("shutting down: %d queued requests answered 503", n)

    async def shutdown(self, grace: float = 10.0) -> None:
        """Graceful stop: no admission, started batches finish within ``grace``, the rest 503."""
        self.begin_shutdown()
        if self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()
        if self._scheduler is not None:
            await self._scheduler.stop(grace)
        await self._transfer.close()
        self._media_exec.shutdown(wait=False, cancel_futures=True)

    # --- /encode --------------------------------------------------------------------------
    def _check_serving(self) -> EncoderAdapter:
        if self.state is State.STOPPING:
            raise ShuttingDown("server is shutting down")
        if self.state is State.FAILED:
            raise NotReady(f"model failed to load: {self.load_error}")
        if self.state is State.LOADING or self.adapter is None:
            raise NotReady("model is still loading")
        return self.adapter

    async def encode(self, body: Any) -> Any:
        """Validate, batch, encode and deliver one /encode body; returns the response body."""
        request = parse_encode_request(body)
        try:
            return await self.encode_request(request)
        except EncoderError as err:
            err.req_id = err.req_id or request.req_id
            raise

    async def encode_request(self, request: EncodeRequest) -> Any:
        """As :meth:`encode` for an already parsed request."""
        adapter = self._check_serving()
        if request.modality not in adapter.modalities:
            allowed = ", ".join(sorted(m.value for m in adapter.modalities))
            raise InvalidRequest(
                f"field 'modality': {request.modality.value} not supported by this model "
                f"({adapter.name} takes {allowed})"
            )
        if request.req_id in self._inflight:
            raise DuplicateRequest(f"req_id {request.req_id!r} is already in flight")
        if self._admitted >= self.settings.admission.max_queue:
            raise Overloaded(f"queue is full ({self.settings.admission.max_queue} requests waiting); retry later")
        transfer = self._transfer.for_request(request)
        self._inflight.add(request.req_id)
        self._admitted += 1
        self.metrics.inflight.inc()
        deadline = time.monotonic() + self.settings.admission.req_timeout
        entry: PendingEntry | None = None
        try:
            entry = await self._admit(request, adapter, deadline)
            part = await self._await_part(entry, deadline)
            self._success.record()
            return await transfer.deliver(request, part)
        except EncoderError as err:
            await transfer.deliver_error(request, err)
            raise
        finally:
            if entry is None:
                self._admitted -= 1
            else:
                entry.release()
            self._inflight.discard(request.req_id)
            self.metrics.inflight.dec()

    async def _admit(self, request: EncodeRequest, adapter: EncoderAdapter, deadline: float) -> PendingEntry:
        started = time.perf_counter()
        try:
            loaded = await asyncio.wait_for(self._load_items(request, adapter), deadline - time.monotonic())
        except TimeoutError:
            raise RequestTimeout(f"fetching and decoding items took over {self.settings.admission.req_timeout}s") from None
        self.metrics.decode_latency.observe(time.perf_counter() - started)
        self._check_serving()
        loop = asyncio.get_running_loop()
        entry = PendingEntry(
            request=request,
            items=[item for item, _ in loaded],
            item_tokens=[tokens for _, tokens in loaded],
            future=loop.create_future(),
            admitted_at=time.monotonic(),
            on_release=self._release_admission,
            deadline=deadline,
        )
        assert self._scheduler is not None
        self._scheduler.submit(entry)
        self.metrics.queue_depth.set(self._scheduler.depth)
        return entry

    def _release_admission(self) -> None:
        self._admitted -= 1

    async def _await_part(self, entry: PendingEntry, deadline: float) -> EncodedPart:
        try:
            return await asyncio.wait_for(entry.future, max(deadline - time.monotonic(), 0))
        except TimeoutError:
            raise RequestTimeout(
                f"request {entry.request.req_id!r} timed out after {self.settings.admission.req_timeout}s (ENCODER_REQ_TIMEOUT)"
            ) from None

    async def _load_items(self, request: EncodeRequest, adapter: EncoderAdapter) -> list[tuple[MediaItem, int]]:
        loop = asyncio.get_running_loop()
        jobs = [
            loop.run_in_executor(self._media_exec, self._load_one, request, index, spec, adapter)
            for index, spec in enumerate(request.items)
        ]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results  # type: ignore[return-value]

    def _load_one(self, request: EncodeRequest, index: int, spec: ItemSpec, adapter: EncoderAdapter) -> tuple[MediaItem, int]:
        """Fetch, decode and measure one item (media thread).

        Only a :class:`MediaError` blames the item (400 naming ``mm_items[i]``). Anything else is
        a fault of ours: logged here once with its traceback, answered 500.
        """
        try:
            data = self._sources.fetch(spec.source)
            item = decode_item(request.modality, data, adapter, self.settings.media)
            return item, adapter.measure(item)
        except MediaError as exc:
            raise ItemError(index, exc.message, req_id=request.req_id) from None
        except EncoderError:
            raise
        except Exception as exc:
            log.exception("request %r: loading mm_items[%d] failed", request.req_id, index)
            raise InternalError(
                f"loading mm_items[{index}] failed inside the server ({type(exc).__name__}: {exc})", req_id=request.req_id
            ) from None

    # --- health, info, profiling ------------------------------------------------------------
    async def health(self) -> None:
        """Raise :class:`NotReady` unless a real tiny encode (or recent live traffic) works."""
        adapter = self._check_serving()
        if self._success.proves_ready():
            return
        if self._health_task is None or self._health_task.done():
            self._health_task = asyncio.create_task(self._health_encode(adapter))
        try:
            await asyncio.wait_for(asyncio.shield(self._health_task), self.settings.observability.health_timeout)
        except TimeoutError:
            raise NotReady(f"health encode took over {self.settings.observability.health_timeout}s") from None
        except EncoderError as err:
            raise NotReady(f"health encode failed: {err.message}") from None

    async def _health_encode(self, adapter: EncoderAdapter) -> None:
        modality = sorted(adapter.modalities, key=lambda m: m.value)[0]
        item = adapter.health_item(modality)
        request = EncodeRequest(req_id=f"health-{time.monotonic_ns()}", modality=modality, items=(ItemSpec("health"),))
        loop = asyncio.get_running_loop()
        # Not counted against MAX_QUEUE: a busy pod must not fail its probe for being busy.
        entry = PendingEntry(request, [item], [adapter.measure(item)], loop.create_future(), time.monotonic())
        assert self._scheduler is not None
        self._scheduler.submit(entry)
        try:
            await entry.future
        finally:
            entry.future.cancel()
        self._success.record()

    async def run_on_model_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` on the thread that runs forwards (the profiler records that thread)."""
        if self._scheduler is None:
            return await asyncio.to_thread(fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._scheduler.model_exec, fn, *args)

    async def start_profile(self, options: dict[str, Any]) -> dict[str, Any]:
        """Start the torch profiler."""
        return await self.run_on_model_thread(self._profiler.start, options)

    async def stop_profile(self) -> dict[str, Any]:
        """Stop the torch profiler and write its trace."""
        return await self.run_on_model_thread(self._profiler.stop)

    async def register_receive_url(self, payload: dict[str, Any]) -> None:
        """zmq_to_scheduler: a prefill rank tells where it receives a request's embedding."""
        await self._transfer.register_receive_url(payload)

    def metrics_text(self) -> bytes:
        """Prometheus text for /metrics."""
        if self._scheduler is not None:
            self.metrics.queue_depth.set(self._scheduler.depth)
        return self.metrics.render()

    def info(self) -> dict[str, Any]:
        """What /server_info shows."""
        return {
            "state": self.state.value,
            "load_error": self.load_error,
            "model": self.adapter.info() if self.adapter else None,
            "queue_depth": self._scheduler.depth if self._scheduler else 0,
            "inflight": len(self._inflight),
            "uptime_s": round(time.time() - self.started_at, 3),
            "settings": self.settings.masked(),
        }
