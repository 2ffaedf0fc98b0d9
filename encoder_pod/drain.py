"""The pod's drain, from the first signal to the exit: its one owner.

:class:`Drain` runs every step, in this order, and nothing else in the pod decides when one
happens (the engine, the faces and the HTTP connections only follow the state it sets):

1. **Refuse new work.** :meth:`Lifecycle.begin_drain <encoder_pod.api.lifecycle.Lifecycle.begin_drain>`:
   readiness 503 ``draining``, every request that arrives from now on 503 + ``Retry-After``,
   every answer ``Connection: close``; the engine is told (its ``/server_info`` state); the drain
   hooks run (unregistering from SGLang bootstrap servers).
2. **Finish what is in flight.** In flight has one definition, the lifecycle's: a request (HTTP,
   any route, or a gRPC call) that arrived before the drain began and whose answer is not yet
   sent. The drain waits for that count to reach 0; at ``ENCODER_DRAIN_TIMEOUT`` what is left
   is answered 503 (:meth:`Lifecycle.expire`). A second signal expires at once.
3. **Linger** :data:`LINGER_S`: a client whose answer just came sends its next request into a
   503, not into a closing listener.
4. **Stop accepting without resetting** (:meth:`Listener.stop_accepting`): the kernel stops
   completing new handshakes first, the connections it already completed are accepted and
   answered, and only then is the listening socket closed (closing it with connections in its
   accept queue resets them, requests included).
5. **Let every connection end** (:meth:`Listener.close_connections`): a request that reached the
   server on a connection accepted before step 4 is answered 503 (each answer closes its
   connection); connections with no request for :data:`IDLE_GRACE_S` are closed.
6. The server stops (the engine shuts down) and the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any, Awaitable, Callable, Protocol, Sequence

from encoder_pod.api.engine import Engine
from encoder_pod.api.lifecycle import Lifecycle

log = logging.getLogger(__name__)

DrainHook = Callable[[], Awaitable[Any] | None]
"""Called once when a drain starts (e.g. unregistering from SGLang bootstrap servers); may return an awaitable."""

HOOK_WAIT_S = 5.0
"""Longest the end of a drain waits for what the drain hooks started (each bounds itself too)."""
EXPIRED_ANSWER_S = 1.0
"""After the drain timeout: time for the 503 answers of what was left to be written."""
LINGER_S = 0.5
"""Once drained, the listener stays open this long more: a client whose last answer just came
sends its next request into a 503 (and moves on), not into a closing listener."""
IDLE_GRACE_S = 1.0
"""After the listener closed: how long an open connection with no request in progress may still
bring one (a connection just accepted from the queue; its request is on its way) before it is closed."""
ANSWERS_S = 5.0
"""After the listener closed: the longest the drain waits for answers still being written (large
inline answers) past the drain timeout."""


class Listener(Protocol):
    """What the drain needs of the HTTP server (``encoder_pod.server`` implements it over uvicorn)."""

    async def stop_accepting(self) -> None:
        """Accept no new connection, without resetting one the kernel already completed."""

    async def close_connections(self, idle_grace: float, deadline: float) -> int:
        """Close each connection once it has no request in progress (an idle one after
        ``idle_grace`` s, to let a request on its way arrive); by ``deadline`` (monotonic) at the
        latest. Returns how many were still open at the deadline."""
        ...


class Drain:
    """The drain of one pod (see the module docstring); every method runs on the server's event loop."""

    def __init__(self, lifecycle: Lifecycle, engine: Engine, drain_timeout: float,
                 hooks: Sequence[DrainHook] = ()) -> None:
        self.lifecycle = lifecycle
        self._engine = engine
        self._drain_timeout = drain_timeout
        self._hooks = list(hooks)
        self._task: asyncio.Task[None] | None = None

    @property
    def started(self) -> bool:
        """True once a signal started the drain."""
        return self._task is not None

    def on_signal(self, sig: int, listener: Listener, then: Callable[[], None]) -> None:
        """The first signal starts the drain (``then()`` runs at its end, whatever happened); a
        later one ends the wait for in-flight work at once (what is left is answered 503)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run_then(sig, listener, then), name="drain")
            return
        log.warning("%s during the drain: answering what is left with 503 now", signal.Signals(sig).name)
        self.lifecycle.expire()

    async def _run_then(self, sig: int, listener: Listener, then: Callable[[], None]) -> None:
        try:
            await self.run(sig, listener)
        except Exception:  # noqa: BLE001 - whatever failed, the process must still stop
            log.exception("drain failed; stopping")
            self.lifecycle.expire()
        then()

    async def run(self, sig: int, listener: Listener) -> None:
        """Steps 1-5 of the module docstring."""
        lifecycle = self.lifecycle
        started = time.monotonic()
        deadline = started + self._drain_timeout
        lifecycle.begin_drain()
        self._engine.begin_drain()
        log.info(
            "%s: draining (ENCODER_DRAIN_TIMEOUT=%gs): /health 503, new requests 503 + Retry-After, "
            "%d requests in flight finish", signal.Signals(sig).name, self._drain_timeout, lifecycle.inflight,
        )
        started_hooks = [a for a in (self._run_hook(hook) for hook in self._hooks) if a is not None]
        if await lifecycle.wait_idle(deadline - time.monotonic()):
            log.info("drained in %.2fs: every request in flight was answered", time.monotonic() - started)
        else:
            log.warning(
                "drain timeout (%gs): %d requests still running are answered 503", self._drain_timeout, lifecycle.inflight
            )
            lifecycle.expire()
            await lifecycle.wait_idle(EXPIRED_ANSWER_S)
        if started_hooks:
            await asyncio.wait(started_hooks, timeout=HOOK_WAIT_S)
        await asyncio.sleep(LINGER_S)
        await listener.stop_accepting()
        left = await listener.close_connections(IDLE_GRACE_S, max(deadline, time.monotonic()) + ANSWERS_S)
        if left:
            log.warning("%d connections still open at the end of the drain are closed", left)
        log.info("listener closed, every connection ended after %.2fs", time.monotonic() - started)

    @staticmethod
    def _run_hook(hook: DrainHook) -> asyncio.Future[Any] | None:
        try:
            result = hook()
        except Exception:  # noqa: BLE001 - one failed hook must not stop the drain
            log.exception("drain hook %r failed", hook)
            return None
        return asyncio.ensure_future(result) if result is not None else None
