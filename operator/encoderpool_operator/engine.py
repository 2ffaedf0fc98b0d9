"""Runs reconciles: one at a time per pool, in worker threads, coalesced, and on a timer.

kopf calls in here from its handlers; nothing here imports kopf, so the same engine can be
driven by a test or by another framework. All state lives on the :class:`Engine` instance.

Children and pods come from a watch cache through ``snapshot`` (kopf's indexes in production),
read in the event loop right before each reconcile; without one, reconcile reads the API server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Protocol

from encoderpool_operator.errors import OperatorError
from encoderpool_operator.metrics import OperatorMetrics
from encoderpool_operator.reconcile import Client, Outcome, Snapshot, reconcile
from encoderpool_operator.settings import OperatorSettings

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, name)
SnapshotSource = Callable[[str, str], Snapshot]


class EngineClient(Client, Protocol):
    """The reconcile client plus listing pools, for the resync, and whether pools are served, for the start."""

    def list_pools(self, namespace: str | None) -> list[dict[str, Any]]:
        """Pools in one namespace, or in all (None)."""

    def serves_pools(self) -> bool:
        """Whether the API server serves EncoderPools yet."""


def utcnow() -> datetime:
    """The current time, timezone-aware."""
    return datetime.now(timezone.utc)


@dataclass
class _Slot:
    """Per-pool serialisation: the lock, how many callers hold or await it, a queued nudge."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
    queued: bool = False


RESULTS = ("ok", "waiting", "failed", "error")
"""The ``result`` label of ``encoderpool_operator_reconciles_total``."""


def error_types(base: type[OperatorError] = OperatorError) -> list[str]:
    """Names of every OperatorError subclass: the ``error`` label of ``..._reconcile_errors_total``."""
    found = []
    for cls in base.__subclasses__():
        found += [cls.__name__, *error_types(cls)]
    return sorted(set(found))


class Engine:
    """Serialises and schedules reconciles of pools."""

    def __init__(self, client: EngineClient, settings: OperatorSettings, clock: Callable[[], datetime] = utcnow,
                 snapshot: SnapshotSource | None = None, metrics: OperatorMetrics | None = None) -> None:
        self.client = client
        self.settings = settings
        self.metrics = metrics or OperatorMetrics()
        # Every result and error type exported at 0 from the start: rate() and increase() over a
        # window then count the first error too (a series born at 1 shows no increase).
        for result in RESULTS:
            self.metrics.reconciles.labels(result)
        for error in error_types():
            self.metrics.errors.labels(error)
        self._clock = clock
        self._snapshot = snapshot
        self._slots: dict[Key, _Slot] = {}
        self._resync: asyncio.Task[None] | None = None
        self._cache_ready = asyncio.Event()

    def cache_ready(self) -> None:
        """The watch cache has been filled once: the resync may run (kopf calls handlers only after that)."""
        self._cache_ready.set()

    def _enter(self, key: Key) -> _Slot:
        slot = self._slots.setdefault(key, _Slot())
        slot.users += 1
        return slot

    def _leave(self, key: Key, slot: _Slot) -> None:
        slot.users -= 1
        if slot.users == 0:
            # Nobody waits: drop the slot so the table does not grow with every pool ever seen.
            self._slots.pop(key, None)

    async def reconcile(self, namespace: str, name: str) -> Outcome:
        """Reconcile one pool now (after any reconcile of it already running); errors propagate."""
        key = (namespace, name)
        slot = self._enter(key)
        try:
            async with slot.lock:
                # Whoever queued a nudge is served by this run: it reads the pool afresh.
                slot.queued = False
                outcome = await self._run(namespace, name)
        finally:
            self._leave(key, slot)
        for event in outcome.events:
            log.info("pool %s/%s: %s: %s", namespace, name, event.reason, event.message)
        return outcome

    async def _run(self, namespace: str, name: str) -> Outcome:
        snapshot = self._snapshot(namespace, name) if self._snapshot is not None else None
        began = time.monotonic()
        try:
            outcome = await asyncio.to_thread(reconcile, self.client, namespace, name, self.settings,
                                              self._clock(), snapshot)
        except OperatorError as exc:
            self.metrics.reconciles.labels("error").inc()
            self.metrics.errors.labels(type(exc).__name__).inc()
            raise
        finally:
            self.metrics.duration.observe(time.monotonic() - began)
        result = "failed" if outcome.failed else "waiting" if outcome.waiting else "ok"
        self.metrics.reconciles.labels(result).inc()
        self.metrics.writes.inc(outcome.writes)
        self.metrics.pool_reason(namespace, name, outcome.status.get("reason") if outcome.found else None)
        self.metrics.pool_status(namespace, name, outcome.status if outcome.found else None, outcome.desired)
        return outcome

    async def nudge(self, namespace: str, name: str) -> None:
        """Reconcile soon, for watch events and resync: coalesced, and errors are only logged.

        A burst of events becomes at most one running and one queued reconcile per pool; the
        queued one waits ``coalesce_seconds`` first, so the rest of a burst joins it.
        """
        key = (namespace, name)
        existing = self._slots.get(key)
        if existing is not None and existing.queued:
            self.metrics.nudges.labels("coalesced").inc()
            return
        self.metrics.nudges.labels("ran").inc()
        slot = self._enter(key)
        slot.queued = True
        try:
            if self.settings.coalesce_seconds > 0:
                await asyncio.sleep(self.settings.coalesce_seconds)
            await self.reconcile(namespace, name)
        except OperatorError as exc:
            log.warning("reconcile of %s/%s failed: %s", namespace, name, exc)
        except Exception:  # noqa: BLE001 - one broken pool must not stop the others' resync
            log.exception("reconcile of %s/%s crashed", namespace, name)
        finally:
            self._leave(key, slot)

    async def resync_once(self) -> int:
        """Reconcile every pool in the watched namespaces; returns how many were visited."""
        scopes: list[str | None] = list(self.settings.namespaces) or [None]
        keys: list[Key] = []
        for scope in scopes:
            try:
                bodies = await asyncio.to_thread(self.client.list_pools, scope)
            except OperatorError as exc:
                log.warning("resync could not list pools in %s: %s", scope or "all namespaces", exc)
                continue
            for body in bodies:
                meta = body.get("metadata") or {}
                keys.append((str(meta.get("namespace")), str(meta.get("name"))))
        # Concurrently, like events: a slow pool does not hold up the others.
        await asyncio.gather(*(self.nudge(ns, name) for ns, name in keys))
        return len(keys)

    async def resync_forever(self) -> None:
        """Every resync period, reconcile every pool: status converges even after a lost event."""
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            await self._cache_ready.wait()
            try:
                visited = await self.resync_once()
            except Exception:  # noqa: BLE001 - the resync must outlive any one failed round
                log.exception("resync failed; retrying in %.0fs", self.settings.resync_seconds)
                continue
            log.debug("resync visited %d pools", visited)

    def start(self) -> None:
        """Start the periodic resync in the running event loop."""
        if self._resync is None:
            self._resync = asyncio.create_task(self.resync_forever(), name="encoderpool-resync")

    async def stop(self) -> None:
        """Stop the periodic resync and wait for it to end."""
        task, self._resync = self._resync, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
