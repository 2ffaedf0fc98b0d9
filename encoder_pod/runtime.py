"""The protocol-neutral encoder runtime: one model replica, its batcher, media loading and transfer.

No HTTP here: the HTTP server (single process) and the data-parallel worker (behind IPC) both
drive this class, so another transport can reuse it without importing the web stack.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from encoder_pod.batching.admission import Admission
from encoder_pod.batching.entry import PendingEntry
from encoder_pod.batching.probe import Prober
from encoder_pod.batching.scheduler import BatchScheduler
from encoder_pod.cache.keys import content_digest, item_key, model_namespace
from encoder_pod.cache.lookup import ItemCache
from encoder_pod.errors import (
    DRAINING_MESSAGE,
    Draining,
    EncoderError,
    InternalError,
    InvalidRequest,
    ItemError,
    MediaError,
    ModelLoadFailed,
    NotReady,
    RequestTimeout,
    ShuttingDown,
)
from encoder_pod.facts import ModelFacts, ReplicaReport
from encoder_pod.allocator import tune_host_allocator
from encoder_pod.media.decode import decode_item
from encoder_pod.media.sources import MediaSources
from encoder_pod.metrics import ReplicaMetrics
from encoder_pod.models.base import EncodedPart, EncoderAdapter, MediaItem
from encoder_pod.modality import Modality
from encoder_pod.models.registry import AdapterLoader, load_adapter
from encoder_pod.models.servable import CheckpointRefused
from encoder_pod.offload import freeze_startup_objects
from encoder_pod.profiling import Profiler, TorchProfiler
from encoder_pod.protocol import EncodeRequest, ItemSpec, parse_encode_request
from encoder_pod.readiness import LoadStep, Readiness, ReplicaState
from encoder_pod.settings import EncoderSettings
from encoder_pod.transfer.inline import InlineAnswer
from encoder_pod.transfer.base import Transfer
from encoder_pod.transfer.router import TransferRouter

log = logging.getLogger(__name__)

T = TypeVar("T")

OnLoadFailed = Callable[[ModelLoadFailed], None]
"""Called (on the event loop) when the load failed, whatever the reason: nothing was admitted yet."""


class EncoderRuntime:
    """Everything one model replica needs to answer /encode, minus the transport."""

    def __init__(
        self,
        settings: EncoderSettings,
        metrics: ReplicaMetrics | None = None,
        *,
        adapter_loader: AdapterLoader = load_adapter,
        transfer: TransferRouter | None = None,
        profiler: Profiler | None = None,
        on_load_failed: OnLoadFailed | None = None,
    ) -> None:
        """``on_load_failed``: what to do when the load fails (the pod's server stops and exits
        ``MODEL_LOAD_FAILED``); without it (a data-parallel worker) the replica stays FAILED."""
        self.settings = settings
        self.metrics = metrics or ReplicaMetrics()
        self.state = ReplicaState.LOADING
        self.step: LoadStep | None = LoadStep.LOADING_WEIGHTS
        """What the replica does while LOADING (None once loaded or failed)."""
        self.load_error: str | None = None
        """Why the load failed: the exception's type and message, or a refusal's message alone
        (it names what happened: ``cannot serve model_type ...``)."""
        self.load_refused = False
        """The load raised :class:`CheckpointRefused`: this pod cannot serve the checkpoint, and
        loading it again would fail the same way (a data-parallel front does not retry it)."""
        self.adapter: EncoderAdapter | None = None
        self._loader = adapter_loader
        self._on_load_failed = on_load_failed
        self._transfer = transfer or TransferRouter(
            settings.transfer, max_registrations=settings.admission.max_queue, bind_host=settings.server.host,
        )
        self._scheduler: BatchScheduler | None = None
        self._media_exec = ThreadPoolExecutor(settings.media.mm_load_workers, thread_name_prefix="media")
        self._sources = MediaSources(settings.media, max_bytes=settings.server.max_request_bytes)
        self._profiler: Profiler = profiler or TorchProfiler()  # a tensor-parallel group passes one that reaches every rank
        self._admission = Admission(settings.admission.max_queue, self.metrics.inflight)
        self._cache = ItemCache(settings.cache.cache_size_mb * 1024 * 1024, self.metrics.registry)
        self._namespace: bytes | None = None
        """The loaded model's cache namespace (:func:`~encoder_pod.cache.keys.model_namespace`)."""
        self.readiness = Readiness(settings.observability.health_timeout)
        """The cached /health verdict (live successes and the prober's outcomes)."""
        self._prober: Prober | None = None
        self._load_task: asyncio.Task[None] | None = None
        self.started_at = time.time()

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Begin loading the model in the background; requests get 503 until it is ready."""
        self._load_task = asyncio.create_task(self._load(), name="model-load")

    async def wait_loaded(self) -> ReplicaState:
        """Wait for the load to finish either way (tests, workers reporting ready)."""
        if self._load_task is not None:
            await asyncio.shield(self._load_task)
        return self.state

    async def _load(self) -> None:
        started = time.perf_counter()
        try:
            tune_host_allocator(self.settings.model.malloc_tuning)
            if self.settings.model.num_threads:
                import torch

                torch.set_num_threads(self.settings.model.num_threads)
            adapter = await asyncio.to_thread(self._loader, self.settings.model)
            self.step = LoadStep.WARMING_UP
            await asyncio.to_thread(adapter.warmup)
            if self._cache.enabled:
                self._namespace = await asyncio.to_thread(model_namespace, adapter.identity(), self.settings)
                self._cache.store.bind(self._namespace)  # another model than before: emptied
        except Exception as exc:  # noqa: BLE001 - any load failure is reported, never raised
            self.load_refused = isinstance(exc, CheckpointRefused)
            self.load_error = str(exc) if self.load_refused else f"{type(exc).__name__}: {exc}"
            self.state, self.step = ReplicaState.FAILED, None
            log.error("model load failed: %s", self.load_error)
            if self._on_load_failed is not None:
                self._on_load_failed(ModelLoadFailed(self.load_error))
            return
        freeze_startup_objects()  # before serving: a full GC pass over the model stack would stall the loop
        self.readiness.success.record()  # the warmup was a real encode of the health item, all four stages
        self.adapter, self.step = adapter, None
        self.metrics.declare([m.value for m in adapter.modalities], self._transfer.delivering)
        self._scheduler = BatchScheduler(adapter, self.settings.batching, self.metrics, on_forward=self._profiler.step)
        self._scheduler.start()
        self._prober = Prober(adapter, self._scheduler, self.readiness, lambda: self.state is ReplicaState.READY)
        self._prober.start()
        if self.state is ReplicaState.LOADING:
            self.state = ReplicaState.READY
        log.info("encoder ready (%s) in %.1fs", adapter.name, time.perf_counter() - started)

    def begin_drain(self) -> None:
        """The pod (``encoder_pod.drain``) or this data-parallel worker drains: readiness turns 503
        (``draining``); everything admitted keeps going. Idempotent.

        New work is refused where it arrives (the faces, or the data-parallel front that stops
        routing here), so a request that arrived before the drain is never refused here.
        """
        if self.state in (ReplicaState.DRAINING, ReplicaState.STOPPING):
            return
        self.state = ReplicaState.DRAINING
        log.info("draining: %d admitted requests finish", self._admission.in_flight)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until every admitted request was answered (or ``timeout`` passed); True when idle.
        A data-parallel worker's own drain (its front is the edge, and its admission what it holds)."""
        return await self._admission.wait_idle(timeout)

    async def shutdown(self, grace: float = 10.0) -> None:
        """Stop: whatever has not started gets 503, started batches finish within ``grace``, the rest 503."""
        self.state = ReplicaState.STOPPING
        self._admission.close()
        if self._scheduler is not None:
            n = self._scheduler.fail_waiting(ShuttingDown("server is shutting down"))
            if n:
                log.info("stopping: %d queued requests answered 503", n)
        if self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()
        if self._prober is not None:
            await self._prober.stop()
        if self._scheduler is not None:
            await self._scheduler.stop(grace)
        await self._transfer.close()
        self._media_exec.shutdown(wait=False, cancel_futures=True)

    # --- /encode --------------------------------------------------------------------------
    def _check_serving(self) -> EncoderAdapter:
        """The adapter, if a request may be admitted now (else the typed 503)."""
        if self.state is ReplicaState.STOPPING:
            raise ShuttingDown("server is shutting down")
        if self.state is ReplicaState.FAILED:
            raise NotReady(f"model failed to load: {self.load_error}")
        if self.state is ReplicaState.LOADING or self.adapter is None:
            raise NotReady("model is still loading")
        return self.adapter

    async def encode(self, body: object) -> InlineAnswer | None:
        """Validate, batch, encode and deliver one /encode body: the inline answer, or None once pushed."""
        request = parse_encode_request(body)
        try:
            return await self.encode_request(request)
        except EncoderError as err:
            err.req_id = err.req_id or request.req_id
            raise

    async def encode_request(self, request: EncodeRequest) -> InlineAnswer | None:
        """As :meth:`encode` for an already parsed request; holds an admission permit until answered."""
        adapter = self._check_serving()
        if request.modality not in adapter.modalities:
            allowed = ", ".join(sorted(m.value for m in adapter.modalities))
            raise InvalidRequest(
                f"field 'modality': {request.modality.value} not supported by this model "
                f"({adapter.name} takes {allowed})"
            )
        async with self._admission.admit(request.req_id):
            transfer = self._transfer.for_request(request)
            deadline = time.monotonic() + self.settings.admission.req_timeout
            try:
                if self._cache.enabled:
                    part = await self._encode_cached(request, adapter, deadline)
                else:
                    entry = await self._enqueue(request, adapter, deadline)
                    part = await self._await_part(entry, deadline)
                self.readiness.success.record()
                self.metrics.items.labels(modality=request.modality.value).inc(len(request.items))
                return await self._deliver(transfer, request, part)
            except EncoderError as err:
                await transfer.deliver_error(request, err)
                raise

    async def _deliver(self, transfer: Transfer, request: EncodeRequest, part: EncodedPart) -> InlineAnswer | None:
        """``transfer.deliver``, timed and its failures counted by backend (``encoder_delivery_*``)."""
        started = time.perf_counter()
        try:
            return await transfer.deliver(request, part)
        except EncoderError as err:
            self.metrics.delivery_failures.labels(backend=transfer.name, kind=err.kind.value).inc()
            raise
        finally:
            self.metrics.delivery_latency.labels(backend=transfer.name).observe(time.perf_counter() - started)

    async def _enqueue(self, request: EncodeRequest, adapter: EncoderAdapter, deadline: float) -> PendingEntry:
        """Fetch, decode and measure the items (media threads), then hand the request to the batcher.

        When the model is idle and every item is in the body, the request goes to the batcher at
        once and the model thread decodes its items just before the forward (two thread hand-offs
        fewer; nothing else waits for the model then).
        """
        if self._decodes_on_model_thread(request):
            return self._submit(request, [], deadline, decode=functools.partial(self._decode_all, request, adapter))
        started = time.perf_counter()
        limit = self.settings.admission.req_timeout
        loaded = await self._until(deadline, self._load_items(request, adapter), f"fetching and decoding items took over {limit}s")
        self.metrics.decode_latency.observe(time.perf_counter() - started)
        self._check_serving()  # a drain lets admitted requests go on
        return self._submit(request, loaded, deadline)

    def _decodes_on_model_thread(self, request: EncodeRequest) -> bool:
        """True when the model thread should decode ``request``'s items (an idle model, items that
        batch and need no fetch: no network or disk read may ever hold up the model thread)."""
        return (
            self._scheduler is not None and self._scheduler.idle and request.modality.batchable
            and all(self._sources.in_body(spec.source) for spec in request.items)
        )

    def _decode_all(self, request: EncodeRequest, adapter: EncoderAdapter) -> list[tuple[MediaItem, int]]:
        """Every item of ``request`` decoded and measured on the calling thread (errors named by item)."""
        started = time.perf_counter()
        try:
            return [
                self._item_step(request, index, self._load_one, request.modality, spec, adapter)
                for index, spec in enumerate(request.items)
            ]
        finally:
            self.metrics.decode_latency.observe(time.perf_counter() - started)

    def _submit(
        self,
        request: EncodeRequest,
        loaded: list[tuple[MediaItem, int]],
        deadline: float,
        decode: Callable[[], list[tuple[MediaItem, int]]] | None = None,
    ) -> PendingEntry:
        """Hand decoded items (or, with ``decode``, how to decode them) to the batcher as one entry;
        its future resolves to their part."""
        if self._scheduler is None:
            raise ShuttingDown("server is shutting down")
        entry = PendingEntry(
            request=request,
            items=[item for item, _ in loaded],
            item_tokens=[tokens for _, tokens in loaded],
            future=asyncio.get_running_loop().create_future(),
            admitted_at=time.monotonic(),
            deadline=deadline,
            decode=decode,
        )
        self._scheduler.submit(entry)
        self.metrics.queue_depth.set(self._scheduler.depth)
        return entry

    async def _await_part(self, entry: PendingEntry, deadline: float) -> EncodedPart:
        return await self._until(deadline, entry.future, self._timed_out(entry.request))

    def _timed_out(self, request: EncodeRequest) -> str:
        return f"request {request.req_id!r} timed out after {self.settings.admission.req_timeout}s (ENCODER_REQ_TIMEOUT)"

    @staticmethod
    async def _until(deadline: float, work: Awaitable[T], message: str) -> T:
        """``work``'s result, or :class:`RequestTimeout` with ``message`` at ``deadline``."""
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
                return await work
        except TimeoutError:
            raise RequestTimeout(message) from None

    async def _encode_cached(self, request: EncodeRequest, adapter: EncoderAdapter, deadline: float) -> EncodedPart:
        """Fetch and hash every item; the cache serves hits and computes only the misses, once (:class:`ItemCache`)."""
        started = time.perf_counter()
        jobs = [(index, self._fetch_one, (spec,)) for index, spec in enumerate(request.items)]
        limit = self.settings.admission.req_timeout
        fetched = await self._until(deadline, self._on_media_threads(request, jobs), f"fetching items took over {limit}s")
        assert self._namespace is not None
        keys = [item_key(self._namespace, request.modality, digest) for _, digest in fetched]
        spent = [time.perf_counter() - started]

        async def compute(indices: list[int]) -> EncodedPart:
            begun = time.perf_counter()
            decode = [(i, self._decode_one, (request.modality, fetched[i][0], adapter)) for i in indices]
            loaded = await self._on_media_threads(request, decode)
            spent.append(time.perf_counter() - begun)
            self._check_serving()
            return await self._submit(request, loaded, deadline).future

        try:
            return await self._until(deadline, self._cache.encode(keys, compute), self._timed_out(request))
        finally:
            self.metrics.decode_latency.observe(sum(spent))

    async def _load_items(self, request: EncodeRequest, adapter: EncoderAdapter) -> list[tuple[MediaItem, int]]:
        jobs = [(index, self._load_one, (request.modality, spec, adapter)) for index, spec in enumerate(request.items)]
        return await self._on_media_threads(request, jobs)

    async def _on_media_threads(self, request: EncodeRequest, jobs: list[tuple[int, Callable[..., T], tuple[Any, ...]]]) -> list[T]:
        """Run ``step(*args)`` per item on the media threads (errors named by item); results in order."""
        loop = asyncio.get_running_loop()
        futures = [
            loop.run_in_executor(self._media_exec, self._item_step, request, index, step, *args) for index, step, args in jobs
        ]
        results = await asyncio.gather(*futures, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results  # type: ignore[return-value]

    def _item_step(self, request: EncodeRequest, index: int, step: Callable[..., T], *args: Any) -> T:
        """One item's media step (media thread).

        Only a :class:`MediaError` blames the item (400 naming ``mm_items[i]``). Anything else is
        a fault of ours: logged here once with its traceback, answered 500.
        """
        try:
            return step(*args)
        except MediaError as exc:
            raise ItemError(index, exc.message, req_id=request.req_id) from None
        except EncoderError:
            raise
        except Exception as exc:
            log.exception("request %r: loading mm_items[%d] failed", request.req_id, index)
            raise InternalError(
                f"loading mm_items[{index}] failed inside the server ({type(exc).__name__}: {exc})", req_id=request.req_id
            ) from None

    def _load_one(self, modality: Modality, spec: ItemSpec, adapter: EncoderAdapter) -> tuple[MediaItem, int]:
        """Fetch, decode and measure one item."""
        return self._decode_one(modality, self._sources.fetch_item(spec), adapter)

    def _decode_one(self, modality: Modality, data: bytes, adapter: EncoderAdapter) -> tuple[MediaItem, int]:
        """Decode and measure one item's bytes."""
        item = decode_item(modality, data, adapter, self.settings.media)
        if modality is Modality.AUDIO and adapter.sample_rate:
            self.metrics.audio_seconds.inc(len(item.data) / adapter.sample_rate)
        return item, adapter.measure(item)

    def _fetch_one(self, spec: ItemSpec) -> tuple[bytes, bytes]:
        """One item's bytes (checked against its ``content_hash``) and their content digest (the key's content part)."""
        data = self._sources.fetch_item(spec)
        return data, content_digest(data, spec.content_hash)  # a verified hash is not computed twice

    # --- health, info, profiling ------------------------------------------------------------
    def not_ready(self) -> EncoderError | None:
        """Why /health is 503 now (None when ready): state and the cached verdict, never a wait."""
        if self.state is ReplicaState.DRAINING:
            return Draining(DRAINING_MESSAGE)
        try:
            self._check_serving()
        except EncoderError as err:
            return err
        problem = self.readiness.problem()
        return NotReady(problem) if problem is not None else None

    async def health(self) -> None:
        """Raise the typed 503 unless a real tiny encode (or live traffic) succeeded recently; answers at once."""
        error = self.not_ready()
        if error is not None:
            raise error

    async def run_on_model_thread(self, fn: Callable[..., T], *args: Any) -> T:
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

    async def control(self, op: str, payload: dict[str, Any]) -> Any:
        """A transfer backend's control operation by name (a prefill rank's call back: receive URLs,
        mooncake pulls); the transfer router refuses one this pod's backend does not serve."""
        return await self._transfer.control(op, payload)

    @property
    def registry(self) -> CollectorRegistry:
        """The registry /metrics renders (the HTTP edge adds its families to it)."""
        return self.metrics.registry

    def metrics_text(self) -> bytes:
        """Prometheus text for /metrics."""
        self._sync_queue_depth()
        return self.metrics.render()

    def metric_families(self) -> list[Metric]:
        """The registry's families now (a data-parallel worker sends them to its front as typed samples)."""
        self._sync_queue_depth()
        return list(self.metrics.registry.collect())

    def _sync_queue_depth(self) -> None:
        if self._scheduler is not None:
            self.metrics.queue_depth.set(self._scheduler.depth)

    def model_facts(self) -> ModelFacts | None:
        """The loaded model's facts (None until it is loaded)."""
        return self.adapter.facts() if self.adapter else None

    def report(self) -> ReplicaReport:
        """What this replica tells a data-parallel front in its heartbeat (and /server_info shows)."""
        return ReplicaReport(
            queue_depth=self._scheduler.depth if self._scheduler else 0,
            inflight=self._admission.in_flight,
            model=self.model_facts(),
            cache=self._cache.facts(),
        )

    def info(self) -> dict[str, Any]:
        """What /server_info shows."""
        report = self.report()
        return {
            "state": self.state.value,
            "load_error": self.load_error,
            "model": report.model.to_json() if report.model else None,
            "queue_depth": report.queue_depth,
            "inflight": report.inflight,
            "cache": report.cache.to_json(),
            "health": self.readiness.describe(),
            "uptime_s": round(time.time() - self.started_at, 3),
            "settings": self.settings.masked(),
        }
