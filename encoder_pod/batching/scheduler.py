"""Cross-request batching: one task owns the waiting queue, a second runs forwards.

Two stages joined by a queue of one prepared batch, so the CPU preprocessing of batch k+1 runs
on its own thread while the forward of batch k runs on the model thread:

    submit() -> inbox -> [former: drop dead, take_batch, preprocess] -> prepared(1)
             -> [runner: forward, postprocess, set futures]

Failure isolation: when a batched processor call or forward raises, every request of that
batch is retried alone, so only requests that fail on their own get an error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable

from encoder_pod.batching.entry import PendingEntry, as_encoder_error
from encoder_pod.batching.formation import BatchLimits, take_batch
from encoder_pod.errors import EncoderError, ShuttingDown, SliceMismatch
from encoder_pod.metrics import ReplicaMetrics
from encoder_pod.models.base import EncodedPart, EncoderAdapter, MediaItem, PreparedBatch
from encoder_pod.settings import BatchingSettings

log = logging.getLogger(__name__)

_Stage = tuple[list[PendingEntry], "PreparedBatch | BaseException"]
"""One preprocessed batch (or why it failed) on its way to the model thread."""


class BatchScheduler:
    """Owns the waiting requests of one model replica and turns them into batches."""

    def __init__(
        self,
        adapter: EncoderAdapter,
        settings: BatchingSettings,
        metrics: ReplicaMetrics,
        on_forward: Callable[[], None] | None = None,
    ) -> None:
        self._adapter = adapter
        self._settings = settings
        self._limits = BatchLimits.of(settings)
        self._metrics = metrics
        self._on_forward = on_forward or (lambda: None)
        self._inbox: asyncio.Queue[PendingEntry] = asyncio.Queue()
        self._waiting: deque[PendingEntry] = deque()
        self._prepared: asyncio.Queue[_Stage] = asyncio.Queue(maxsize=1)
        self._pre_exec = ThreadPoolExecutor(1, thread_name_prefix="preprocess")
        self.model_exec = ThreadPoolExecutor(1, thread_name_prefix="model")
        self._tasks: list[asyncio.Task[None]] = []
        self._busy = 0

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the former and runner tasks on the running loop."""
        self._tasks = [
            asyncio.create_task(self._form_loop(), name="batch-former"),
            asyncio.create_task(self._run_loop(), name="batch-runner"),
        ]

    def submit(self, entry: PendingEntry) -> None:
        """Hand an admitted, decoded request to the queue's owner."""
        self._inbox.put_nowait(entry)

    def fail_waiting(self, error: EncoderError) -> int:
        """Fail every request that has not started (shutdown); returns how many."""
        entries = list(self._waiting)
        self._waiting.clear()
        while not self._inbox.empty():
            entries.append(self._inbox.get_nowait())
        for entry in entries:
            entry.fail(error)
        return len(entries)

    async def stop(self, grace: float = 0.0) -> None:
        """Stop: fail waiting requests, let started batches finish within ``grace``, fail the rest."""
        self.fail_waiting(ShuttingDown("server is shutting down"))
        deadline = time.monotonic() + grace
        while (self._busy or not self._prepared.empty()) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        while not self._prepared.empty():
            for entry in self._prepared.get_nowait()[0]:
                entry.fail(ShuttingDown("server is shutting down"))
        self.fail_waiting(ShuttingDown("server is shutting down"))
        self._pre_exec.shutdown(wait=False, cancel_futures=True)
        self.model_exec.shutdown(wait=False, cancel_futures=True)

    @property
    def depth(self) -> int:
        """Requests submitted and not yet taken into a batch."""
        return len(self._waiting) + self._inbox.qsize()

    async def probe(self, items: list[MediaItem]) -> EncodedPart:
        """The priority lane (readiness probes): preprocess on a thread of its own, then the forward
        on the model thread right after the one in progress, ahead of every prepared or waiting
        batch (the runner hands the model thread one forward at a time). Not a batch: no batch metrics."""
        prepared = await asyncio.to_thread(self._adapter.preprocess, [items])
        parts = await asyncio.get_running_loop().run_in_executor(self.model_exec, self._forward, prepared)
        return parts[0]

    # --- stage 1: forming and preprocessing -----------------------------------------------
    async def _pull(self, timeout: float | None) -> bool:
        """Move arrivals into the waiting deque; wait up to ``timeout`` (None = forever) for one."""
        if self._inbox.empty():
            try:
                entry = await (self._inbox.get() if timeout is None else asyncio.wait_for(self._inbox.get(), timeout))
            except TimeoutError:
                return False
            self._waiting.append(entry)
        while not self._inbox.empty():
            self._waiting.append(self._inbox.get_nowait())
        return True

    def _drop_dead(self, entries: Iterable[PendingEntry]) -> list[PendingEntry]:
        """The live entries of ``entries``; every dead one is counted as dropped (the one drop loop)."""
        alive = []
        for entry in entries:
            if entry.alive:
                alive.append(entry)
            else:
                self._metrics.dropped.labels(reason=entry.drop_reason).inc()
        return alive

    def _take(self, started: list[PendingEntry]) -> list[PendingEntry]:
        """Drop dead waiters, then form (or extend) a batch from the waiting deque (:func:`take_batch`)."""
        batch, rest = take_batch(self._drop_dead(self._waiting), self._limits, started)
        self._waiting = deque(rest)
        return batch

    async def _next_batch(self) -> list[PendingEntry]:
        await self._pull(None if not self._waiting else 0)
        batch = self._take([])
        wait_s = self._settings.max_wait_ms / 1000.0
        if batch and wait_s > 0 and batch[0].modality.batchable:
            deadline = time.monotonic() + wait_s
            while len(batch) < self._settings.max_batch_size and (left := deadline - time.monotonic()) > 0:
                if await self._pull(left):
                    batch = self._take(batch)
        return self._drop_dead(batch)

    async def _form_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            if not batch:
                continue
            now = time.monotonic()
            for entry in batch:
                self._metrics.queue_wait.observe(now - entry.admitted_at)
            self._metrics.queue_depth.set(self.depth)
            for stage in await self._preprocess(loop, batch):
                await self._prepared.put(stage)

    async def _preprocess(self, loop: asyncio.AbstractEventLoop, batch: list[PendingEntry]) -> list[_Stage]:
        try:
            return [(batch, await self._timed_preprocess(loop, batch))]
        except Exception as exc:  # noqa: BLE001 - isolated below, one request at a time
            if len(batch) == 1:
                return [(batch, exc)]
            self._metrics.batch_failures.labels(stage="preprocess").inc()
            log.warning("batched preprocess of %d requests failed (%s); retrying one by one", len(batch), exc)
        stages: list[_Stage] = []
        for entry in batch:
            try:
                stages.append(([entry], await self._timed_preprocess(loop, [entry])))
            except Exception as exc:  # noqa: BLE001 - this request fails on its own
                stages.append(([entry], exc))
        return stages

    async def _timed_preprocess(self, loop: asyncio.AbstractEventLoop, batch: list[PendingEntry]) -> PreparedBatch:
        start = time.perf_counter()
        prepared = await loop.run_in_executor(self._pre_exec, self._adapter.preprocess, [e.items for e in batch])
        self._metrics.preprocess_latency.observe(time.perf_counter() - start)
        return prepared

    # --- stage 2: forward -------------------------------------------------------------------
    def _forward(self, prepared: PreparedBatch) -> list[EncodedPart]:
        start = time.perf_counter()
        try:
            output = self._adapter.forward(prepared)
            return self._adapter.postprocess(output, prepared)
        finally:
            self._metrics.forward_latency.observe(time.perf_counter() - start)
            self._on_forward()

    async def _run_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            entries, prepared = await self._prepared.get()
            self._busy += 1
            try:
                await self._run_stage(loop, entries, prepared)
            finally:
                self._busy -= 1

    async def _run_stage(
        self, loop: asyncio.AbstractEventLoop, entries: list[PendingEntry], prepared: PreparedBatch | BaseException
    ) -> None:
        if not any(e.alive for e in entries):
            self._drop_dead(entries)  # every caller gave up while it was preprocessed
            return
        if isinstance(prepared, BaseException):
            for entry in entries:
                entry.fail(as_encoder_error(prepared, stage="preprocess"))
            return
        try:
            parts = await loop.run_in_executor(self.model_exec, self._forward, prepared)
        except Exception as exc:  # noqa: BLE001 - isolated below
            if isinstance(exc, SliceMismatch):
                self._metrics.slice_mismatches.inc()
            if len(entries) == 1:
                entries[0].fail(as_encoder_error(exc, stage="forward"))
                return
            self._metrics.batch_failures.labels(stage="forward").inc()
            log.warning("forward of %d requests failed (%s); retrying one by one", len(entries), exc)
            for entry in entries:
                for stage in await self._preprocess(loop, [entry]):
                    await self._run_stage(loop, *stage)
            return
        self._observe(entries, prepared)
        for entry, part in zip(entries, parts):
            entry.succeed(part)

    def _observe(self, entries: list[PendingEntry], prepared: PreparedBatch) -> None:
        self._metrics.batch_size.observe(len(entries))
        self._metrics.batch_items.observe(sum(len(e.items) for e in entries))
        self._metrics.batch_tokens.observe(prepared.total_tokens)
