"""The readiness probe: a real tiny encode on the batcher's priority lane, run in the background.

``/health`` answers from a :class:`~encoder_pod.readiness.Readiness` verdict and never waits for
it. The :class:`Prober` keeps that verdict fresh: whenever no encode succeeded in the last
``HEALTH_SKIP_S`` seconds (live traffic counts), it encodes the adapter's health item on
:meth:`BatchScheduler.probe`, the priority lane: preprocessed on a thread of its own, forwarded on
the model thread right after the forward in progress, ahead of every prepared or waiting batch.
So a probe never waits behind the queue, only for at most one forward. One probe at a time; its
outcome (or that it is taking longer than ``ENCODER_HEALTH_TIMEOUT``) is the verdict. Probes are
not batches: they do not count in the batch metrics.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from encoder_pod.batching.scheduler import BatchScheduler
from encoder_pod.errors import EncoderError
from encoder_pod.models.base import EncoderAdapter
from encoder_pod.readiness import PROBE_TICK_S, Readiness

log = logging.getLogger(__name__)


class Prober:
    """Runs probe encodes for one replica while ``serving()`` says so."""

    def __init__(
        self, adapter: EncoderAdapter, scheduler: BatchScheduler, readiness: Readiness, serving: Callable[[], bool]
    ) -> None:
        self._adapter = adapter
        self._scheduler = scheduler
        self._readiness = readiness
        self._serving = serving
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start probing on the running loop (the first probe at once)."""
        self._task = asyncio.create_task(self._loop(), name="health-prober")

    async def stop(self) -> None:
        """Stop probing (a probe in flight is abandoned; the scheduler fails it on stop)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            if self._serving() and self._readiness.probe_due():
                await self.probe_once()
            await asyncio.sleep(PROBE_TICK_S)

    async def probe_once(self) -> None:
        """One probe encode, its outcome recorded in the verdict (never raises but on cancellation)."""
        was_ready = self._readiness.problem() is None
        self._readiness.probe_started()
        error: str | None = None
        try:
            await self._encode()
        except EncoderError as err:
            error = err.message
        except Exception as exc:  # noqa: BLE001 - a probe failure is a verdict, not a crash
            log.exception("health encode raised")
            error = f"{type(exc).__name__}: {exc}"
        self._readiness.probe_finished(error)
        if error is not None and was_ready:
            log.warning("health encode failed; /health answers 503: %s", error)
        elif error is None and not was_ready:
            log.info("health encode succeeded; /health answers 200")

    async def _encode(self) -> None:
        adapter = self._adapter
        modality = sorted(adapter.modalities, key=lambda m: m.value)[0]
        # Not counted against MAX_QUEUE (a busy pod must not fail its probe for being busy).
        await self._scheduler.probe([adapter.health_item(modality)])
