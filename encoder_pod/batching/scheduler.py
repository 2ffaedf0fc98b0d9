"""Cross-request batching: one task owns the waiting queue, a second runs forwards.

Two stages, at most one batch between them, and batches formed late:

    submit() -> inbox -> [former: drop dead, take_batch when due, preprocess] -> prepared (one batch)
             -> [runner: forward, postprocess, set futures]

The former forms the next batch only once the prepared slot is empty (the runner took the batch
before it) and the model is about to be free: :func:`~encoder_pod.batching.pacing.formation_due`
puts that moment one preprocessing estimate before the forward in progress should end, so the
next batch's preprocessing still overlaps that forward, and every request that arrived until then
joins it. A forward of unknown length (nothing seen yet) is waited for. A request that finds
the model idle goes from :meth:`BatchScheduler.submit` straight to the runner, and is preprocessed
on the model thread itself, in the same call as its forward: there is nothing to overlap with,
and it saves a loop turn and a hand-off between threads. For the same
reason a request that finds the model idle (:attr:`BatchScheduler.idle`) may be submitted with its
items still to decode: the model thread decodes them too, and the request runs alone.

Failure isolation: when a batched processor call or forward raises, every request of that
batch is retried alone, so only requests that fail on their own get an error.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable

from encoder_pod.batching.entry import PendingEntry, as_encoder_error
from encoder_pod.batching.formation import BatchLimits, take_batch
from encoder_pod.batching.pacing import Pacing, formation_due
from encoder_pod.errors import EncoderError, ShuttingDown, SliceMismatch
from encoder_pod.metrics import ReplicaMetrics
from encoder_pod.models.base import EncodedPart, EncoderAdapter, MediaItem, PreparedBatch
from encoder_pod.settings import BatchingSettings

log = logging.getLogger(__name__)

_Stage = tuple[list[PendingEntry], "PreparedBatch | BaseException | None"]
"""One batch on its way to the model thread: preprocessed, why that failed, or None: the model was
idle when it formed, so it is preprocessed on the model thread itself, just before its forward."""


class _PreprocessFailed(Exception):
    """Carries a preprocessing failure out of a preprocess-and-forward call on the model thread."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class BatchScheduler:
    """Owns the waiting requests of one model replica and turns them into batches."""

    def __init__(
        self,
        adapter: EncoderAdapter,
        settings: BatchingSettings,
        metrics: ReplicaMetrics,
        on_forward: Callable[[], None] | None = None,
        pacing: Pacing | None = None,
    ) -> None:
        self._adapter = adapter
        self._settings = settings
        self._limits = BatchLimits.of(settings)
        self._metrics = metrics
        self._on_forward = on_forward or (lambda: None)
        self._pacing = pacing or Pacing()
        self._inbox: asyncio.Queue[PendingEntry] = asyncio.Queue()
        self._waiting: deque[PendingEntry] = deque()
        self._prepared: asyncio.Queue[_Stage] = asyncio.Queue()
        """Preprocessed batches for the runner: one at a time (more only for one-by-one retries)."""
        self._forming: list[PendingEntry] = []
        """The batch being preprocessed (failed by :meth:`stop` if it never reaches the runner)."""
        self._free_at = -math.inf
        """When the model should be free: -inf idle, inf while a forward of unknown length runs."""
        self._wake = asyncio.Event()
        """Set on every arrival, and on every change of the runner while requests wait (:meth:`_nudge`):
        the former looks again."""
        self._pre_exec = ThreadPoolExecutor(1, thread_name_prefix="preprocess")
        self.model_exec = ThreadPoolExecutor(1, thread_name_prefix="model")
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: list[PendingEntry] = []
        """The batch the runner holds (in its forward, or retried one by one)."""

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the former and runner tasks on the running loop."""
        self._loop = asyncio.get_running_loop()
        self._tasks = [
            asyncio.create_task(self._form_loop(), name="batch-former"),
            asyncio.create_task(self._run_loop(), name="batch-runner"),
        ]

    def submit(self, entry: PendingEntry) -> None:
        """Hand an admitted request to the queue's owner; when the model is :attr:`idle`, straight
        to the runner (a batch of one, preprocessed on the model thread, as the former would do
        with it, a loop turn sooner)."""
        if self.idle and self._tasks:
            self._metrics.queue_wait.observe(time.monotonic() - entry.admitted_at)
            self._prepared.put_nowait(([entry], None))
            return
        self._inbox.put_nowait(entry)
        self._wake.set()

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
        while (self._running or self._forming or not self._prepared.empty()) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        unfinished = self._running + self._forming
        while not self._prepared.empty():
            unfinished.extend(self._prepared.get_nowait()[0])
        for entry in unfinished:
            entry.fail(ShuttingDown("server is shutting down"))
        self.fail_waiting(ShuttingDown("server is shutting down"))
        self._pre_exec.shutdown(wait=False, cancel_futures=True)
        self.model_exec.shutdown(wait=False, cancel_futures=True)

    @property
    def idle(self) -> bool:
        """A request submitted now is the next forward, at once: nothing runs, is prepared, forms or
        waits, and no ``MAX_WAIT_MS`` holds a batch back for companions."""
        return (
            self._free_at == -math.inf and not self._running and not self._forming
            and self._prepared.empty() and not self._waiting and self._inbox.empty()
            and self._settings.max_wait_ms == 0
        )

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

    def _nudge(self) -> None:
        """Tell the former that the runner changed (the slot ahead of the model, when it is free),
        if any request waits to be formed: with none, the former has nothing to look at, and an
        arrival wakes it anyway (:meth:`submit`). At concurrency 1 this spares the loop a turn of
        the former per request, each one taken while the model thread waits for the GIL."""
        if self.depth:
            self._wake.set()

    # --- stage 1: forming and preprocessing -----------------------------------------------
    async def _sleep(self, timeout: float | None) -> None:
        """Until something changes (an arrival, the runner) or ``timeout`` seconds (None: no limit)."""
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            pass
        self._wake.clear()

    def _drop_dead(self, entries: Iterable[PendingEntry]) -> list[PendingEntry]:
        """The live entries of ``entries``; every dead one is counted as dropped (the one drop loop)."""
        alive = []
        for entry in entries:
            if entry.alive:
                alive.append(entry)
            else:
                self._metrics.dropped.labels(reason=entry.drop_reason).inc()
        return alive

    def _due(self, batch: list[PendingEntry]) -> float:
        """When ``batch``, as it stands, should be committed (:func:`formation_due`)."""
        full = len(batch) >= self._limits.max_batch_size or not batch[0].modality.batchable or not batch[0].decoded
        return formation_due(
            model_free_at=self._free_at,
            preprocess_s=self._pacing.preprocess.predict(sum(e.tokens for e in batch)),
            oldest_submitted=batch[0].admitted_at,
            max_wait_s=self._settings.max_wait_ms / 1000.0,
            full=full,
        )

    async def _next_batch(self) -> list[PendingEntry]:
        """The next batch, taken from the waiting requests (:func:`take_batch`) once it is due."""
        while True:
            while not self._inbox.empty():
                self._waiting.append(self._inbox.get_nowait())
            self._waiting = deque(self._drop_dead(self._waiting))
            if self._waiting and not self._waiting[0].decoded:  # its size is not known yet: alone
                batch, rest = [self._waiting[0]], list(self._waiting)[1:]
            else:
                batch, rest = take_batch(self._waiting, self._limits)
            if not batch:
                await self._sleep(None)
                continue
            wait = self._due(batch) - time.monotonic()
            if wait <= 0:
                self._waiting = deque(rest)
                return batch
            await self._sleep(wait if math.isfinite(wait) else None)

    async def _form_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._prepared.empty():  # one batch ahead of the model, never more
                await self._sleep(None)
            batch = await self._next_batch()
            now = time.monotonic()
            for entry in batch:
                self._metrics.queue_wait.observe(now - entry.admitted_at)
            self._metrics.queue_depth.set(self.depth)
            if self._free_at == -math.inf and not self._running:
                # Nothing to overlap with: preprocessing on the model thread saves a hand-off.
                self._prepared.put_nowait((batch, None))
                continue
            self._forming = batch
            stages = await self._preprocess(loop, batch)
            self._forming = []
            for stage in stages:
                self._prepared.put_nowait(stage)

    async def _preprocess(self, loop: asyncio.AbstractEventLoop, batch: list[PendingEntry]) -> list[_Stage]:
        try:
            return [(batch, await self._timed_preprocess(loop, batch))]
        except Exception as exc:  # noqa: BLE001 - isolated below, one request at a time
            return await self._preprocess_alone(loop, batch, exc)

    async def _preprocess_alone(self, loop: asyncio.AbstractEventLoop, batch: list[PendingEntry], exc: Exception) -> list[_Stage]:
        """After the batched processor call raised ``exc``: each request preprocessed on its own."""
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
        return await loop.run_in_executor(self._pre_exec, self._preprocess_now, batch)

    def _preprocess_now(self, batch: list[PendingEntry]) -> PreparedBatch:
        """The processor call of ``batch`` on the calling thread, timed (after decoding what is still to be)."""
        if not batch[0].decoded:
            self._decode_alone(batch[0])
        start = time.perf_counter()
        prepared = self._adapter.preprocess([e.items for e in batch])
        seconds = time.perf_counter() - start
        self._metrics.preprocess_latency.observe(seconds)
        self._pacing.preprocess.observe(sum(e.tokens for e in batch), seconds)
        return prepared

    def _decode_alone(self, entry: PendingEntry) -> None:
        """Decode an entry submitted undecoded (it runs alone), then tell the former when its forward
        should end: until then the model counted as busy for an unknown time, and the next batch
        would not be preprocessed during this forward."""
        entry.decode_now()
        if self._running[:1] != [entry]:  # preprocessed ahead, not on the model thread: nothing to tell
            return
        ahead = self._pacing.preprocess.predict(entry.tokens)
        self._free_at = self._pacing.forward_end(time.monotonic() + ahead, entry.tokens)  # one store, read by the loop
        if self.depth and self._loop is not None:  # someone waits for it (read across threads: only a hint)
            self._loop.call_soon_threadsafe(self._wake.set)

    def _preprocess_and_forward(self, batch: list[PendingEntry]) -> None:
        """Both stages in one call on the model thread (an idle model: no thread hand-off between them)."""
        try:
            prepared = self._preprocess_now(batch)
        except Exception as exc:  # noqa: BLE001 - told apart from a failed forward by the caller
            raise _PreprocessFailed(exc) from exc
        self._forward(prepared, batch)

    # --- stage 2: forward -------------------------------------------------------------------
    def _forward(self, prepared: PreparedBatch, entries: list[PendingEntry] | None = None) -> list[EncodedPart]:
        """The forward and slicing of ``prepared`` (model thread). With ``entries``, the batch is
        counted and its callers get their parts in the loop's next turn (:meth:`_answer`), a turn
        before the runner learns that the forward is over."""
        start = time.perf_counter()
        try:
            output = self._adapter.forward(prepared)
            parts = self._adapter.postprocess(output, prepared)
            if entries is not None and self._loop is not None:
                self._loop.call_soon_threadsafe(self._answer, entries, prepared, parts)
            self._pacing.forward.observe(prepared.total_tokens, time.perf_counter() - start)
            return parts
        finally:
            self._metrics.forward_latency.observe(time.perf_counter() - start)
            self._on_forward()

    async def _run_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._prepared.empty():
                self._free_at = -math.inf  # idle: the next batch is due as soon as it exists
                self._nudge()
            entries, prepared = await self._prepared.get()
            self._nudge()  # the slot ahead of the model is free again
            self._running = entries
            await self._run_stage(loop, entries, prepared)
            self._running = []  # not on cancellation: stop() fails what was left running

    async def _run_stage(
        self, loop: asyncio.AbstractEventLoop, entries: list[PendingEntry], prepared: PreparedBatch | BaseException | None
    ) -> None:
        if not any(e.alive for e in entries):
            self._drop_dead(entries)  # every caller gave up while it was preprocessed
            return
        if isinstance(prepared, BaseException):
            for entry in entries:
                entry.fail(as_encoder_error(prepared, stage="preprocess"))
            return
        try:
            await self._compute(loop, entries, prepared)
        except _PreprocessFailed as failed:
            for stage in await self._preprocess_alone(loop, entries, failed.cause):
                await self._run_stage(loop, *stage)
            return
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
        # Answered already, from the model thread (_forward -> _answer), one loop turn earlier.

    async def _compute(
        self, loop: asyncio.AbstractEventLoop, entries: list[PendingEntry], prepared: PreparedBatch | None
    ) -> None:
        """The forward of a prepared batch, or preprocessing and forward of an unprepared one, on the model
        thread; its callers are answered from there (:meth:`_forward`)."""
        tokens = sum(e.tokens for e in entries)
        ahead = self._pacing.preprocess.predict(tokens) if prepared is None else 0.0
        # Not decoded yet: busy for an unknown time, until the model thread tells (_decode_alone).
        known = all(e.decoded for e in entries)
        self._free_at = self._pacing.forward_end(time.monotonic() + ahead, tokens) if known else math.inf
        self._nudge()
        if prepared is None:
            await loop.run_in_executor(self.model_exec, self._preprocess_and_forward, entries)
        else:
            await loop.run_in_executor(self.model_exec, self._forward, prepared, entries)

    def _answer(self, entries: list[PendingEntry], prepared: PreparedBatch, parts: list[EncodedPart]) -> None:
        """Count the batch and give each caller its part (on the loop; a caller gone is skipped)."""
        self._observe(entries, prepared)
        for entry, part in zip(entries, parts):
            entry.succeed(part)

    def _observe(self, entries: list[PendingEntry], prepared: PreparedBatch) -> None:
        self._metrics.batch_size.observe(len(entries))
        self._metrics.batch_items.observe(sum(len(e.items) for e in entries))
        self._metrics.batch_tokens.observe(prepared.total_tokens)

