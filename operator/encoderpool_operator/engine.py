"""Runs reconciles: one at a time per pool, in worker threads, coalesced, and on a timer.

kopf calls in here from its handlers; nothing here imports kopf, so the same engine can be
driven by a test or by another framework. All state lives on the :class:`Engine` instance.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Protocol

from encoderpool_operator.errors import OperatorError
from encoderpool_operator.reconcile import Client, Outcome, reconcile
from encoderpool_operator.settings import OperatorSettings

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, name)


class EngineClient(Client, Protocol):
    """The reconcile client plus listing pools, for the resync."""

    def list_pools(self, namespace: str | None) -> list[dict[str, Any]]:
        """Pools in one namespace, or in all (None)."""


def utcnow() -> datetime:
    """The current time, timezone-aware."""
    return datetime.now(timezone.utc)


@dataclass
class _Slot:
    """Per-pool serialisation: the lock, how many callers hold or await it, a queued nudge."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
    queued: bool = False


class Engine:
    """Serialises and schedules reconciles of pools."""

    def __init__(self, client: EngineClient, settings: OperatorSettings, clock: Callable[[], datetime] = utcnow) -> None:
        self.client = client
        self.settings = settings
        self._clock = clock
        self._slots: dict[Key, _Slot] = {}
        self._resync: asyncio.Task[None] | None = None
        self.last_resync: datetime | None = None

    async def reconcile(self, namespace: str, name: str) -> Outcome:
        """Reconcile one pool now (after any reconcile of it already running); errors propagate."""
        key = (namespace, name)
        slot = self._slots.setdefault(key, _Slot())
        slot.users += 1
        try:
            async with slot.lock:
                # Whoever queued a nudge is served by this run: it reads the pool afresh.
                slot.queued = False
                outcome = await asyncio.to_thread(reconcile, self.client, namespace, name, self.settings, self._clock())
        finally:
            slot.users -= 1
            if slot.users == 0:
                # Nobody waits: drop the slot so the table does not grow with every pool ever seen.
                self._slots.pop(key, None)
        for event in outcome.events:
            log.info("pool %s/%s: %s: %s", namespace, name, event.reason, event.message)
        return outcome

    async def nudge(self, namespace: str, name: str) -> None:
        """Reconcile soon, for watch events and resync: coalesced, and errors are only logged.

        A burst of pod events becomes at most one running and one queued reconcile per pool.
        """
        slot = self._slots.get((namespace, name))
        if slot is not None and slot.queued:
            return
        if slot is not None:
            slot.queued = True
        try:
            await self.reconcile(namespace, name)
        except OperatorError as exc:
            log.warning("reconcile of %s/%s failed: %s", namespace, name, exc)
        except Exception:  # noqa: BLE001 - one broken pool must not stop the others' resync
            log.exception("reconcile of %s/%s crashed", namespace, name)

    async def resync_once(self) -> int:
        """Reconcile every pool in the watched namespaces; returns how many were visited."""
        scopes: list[str | None] = list(self.settings.namespaces) or [None]
        visited = 0
        for scope in scopes:
            try:
                bodies = await asyncio.to_thread(self.client.list_pools, scope)
            except OperatorError as exc:
                log.warning("resync could not list pools in %s: %s", scope or "all namespaces", exc)
                continue
            for body in bodies:
                meta = body.get("metadata") or {}
                await self.nudge(str(meta.get("namespace")), str(meta.get("name")))
                visited += 1
        return visited

    async def resync_forever(self) -> None:
        """Every resync period, reconcile every pool: status converges even after a lost event."""
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            visited = await self.resync_once()
            self.last_resync = self._clock()
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
