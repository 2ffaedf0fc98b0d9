"""The pod's drain state, shared by every face: what is in flight, when the drain began, when it ran out.

SIGTERM starts a drain (``encoder_pod.drain.Drain`` runs it; this module only holds its state).
**In flight** has one definition, :attr:`Lifecycle.inflight`: a request that arrived before the
drain began (HTTP, on any route, or a gRPC call) and whose answer is not yet sent. From the
drain's start:

- ``/health`` and ``/health_generate`` answer 503 ``draining ...`` (readiness false, the pod
  leaves the Service), ``/livez`` stays 200;
- a NEW ``/encode`` is answered 503 with ``Retry-After: 1`` (its body is read first, so closing
  the connection never resets a client still sending);
- every request that arrived before goes on and is delivered; :meth:`Lifecycle.wait_idle`
  returns once the last of them has been answered;
- every response carries ``Connection: close``, so keep-alive clients move to another pod
  instead of reusing a connection that is about to close;
- at ``ENCODER_DRAIN_TIMEOUT`` (:meth:`Lifecycle.expire`) whatever is still running is answered
  503 + Retry-After.

The listener stays open through all of it; the drain closes it once nothing is in flight.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, MutableMapping

from encoder_pod.api.engine import Engine
from encoder_pod.errors import DRAINING_MESSAGE, Draining

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ARRIVED_DRAINING = "encoderpool.arrived_draining"
"""Scope key: True when the request arrived after the drain began (it is refused, never admitted)."""


class Lifecycle:
    """Drain state of one HTTP edge; every method runs on its event loop."""

    def __init__(self) -> None:
        self.drain_started: float | None = None
        """When the drain began (monotonic), None while serving."""
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._expired: asyncio.Future[None] | None = None
        self.expired_at: float | None = None

    @property
    def draining(self) -> bool:
        """True from the start of the drain on."""
        return self.drain_started is not None

    @property
    def inflight(self) -> int:
        """Requests (every route, every face) that arrived before the drain and are not yet answered."""
        return self._inflight

    @property
    def expired(self) -> asyncio.Future[None]:
        """Resolves when the drain timeout passed: handlers still running answer 503 then."""
        if self._expired is None:
            self._expired = asyncio.get_running_loop().create_future()
        return self._expired

    def begin_drain(self) -> bool:
        """Start draining; False if it had already started."""
        if self.drain_started is not None:
            return False
        self.drain_started = time.monotonic()
        return True

    def expire(self) -> None:
        """The drain ran out of time: every tracked request still running is answered 503 now."""
        if self.expired_at is None:
            self.expired_at = time.monotonic()
        if not self.expired.done():
            self.expired.set_result(None)

    @staticmethod
    def arrived_draining(scope: Scope) -> bool:
        """Whether this request arrived after the drain began (decided once, by :class:`DrainGate`)."""
        return bool(scope.get(ARRIVED_DRAINING, False))

    def refusal(self) -> Draining:
        """The 503 for a request that arrived during the drain."""
        return Draining(DRAINING_MESSAGE)

    def expiry_error(self, drain_timeout: float) -> Draining:
        """The 503 for a request still running when the drain timeout passed."""
        return Draining(
            f"draining: this request did not finish within the drain timeout of {drain_timeout:g}s "
            "(ENCODER_DRAIN_TIMEOUT); retry on another encoder"
        )

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no tracked request is running (or ``timeout`` passed); True when idle."""
        try:
            await asyncio.wait_for(self._idle.wait(), max(0.0, timeout))
        except TimeoutError:
            return False
        return True

    def enter(self) -> None:
        """A request arrived before the drain (each face calls it once per request, and :meth:`leave` once)."""
        self._inflight += 1
        self._idle.clear()

    def leave(self) -> None:
        """A request was answered (its response sent, or its client gone)."""
        self._inflight -= 1
        if self._inflight == 0:
            self._idle.set()


async def check_ready(engine: Engine, lifecycle: Lifecycle) -> None:
    """The pod's one readiness verdict, as ``/health`` answers it and gRPC's health service reports
    it: raises the typed 503 (draining, loading, failed, stale), returns when ready. From state, at once."""
    if lifecycle.draining:
        raise lifecycle.refusal()
    await engine.health()


class DrainGate:
    """ASGI middleware: counts each HTTP request that arrived before the drain until its response
    is sent; ``Connection: close`` on every answer while draining."""

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle) -> None:
        self.app = app
        self.lifecycle = lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app; the request counts only if it arrived before the drain began."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        lifecycle = self.lifecycle

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start" and lifecycle.draining:
                message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            await send(message)

        scope[ARRIVED_DRAINING] = lifecycle.draining
        if lifecycle.draining:
            await self.app(scope, receive, send_closing)
            return
        lifecycle.enter()
        try:
            await self.app(scope, receive, send_closing)
        finally:
            lifecycle.leave()
