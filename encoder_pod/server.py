"""Running the encoder pod: build the engine for the settings, serve it with uvicorn, drain on SIGTERM.

SIGTERM (or SIGINT) starts a drain BEFORE uvicorn's own shutdown, which would close the
listening socket at once: readiness turns 503, the drain hooks run (unregistering from SGLang
bootstrap servers), new requests get 503 + ``Retry-After``, and the listener keeps accepting and
answering while everything admitted finishes and is delivered (and :data:`LINGER_S` more).
Then uvicorn shuts down as usual
(listener closed, idle connections closed, responses still being written finish), the engine
stops and the process exits 0. At ``ENCODER_DRAIN_TIMEOUT`` whatever is left is answered 503; a
second signal ends the drain at once the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import threading
import time
from types import FrameType
from typing import Any, Awaitable, Callable, Iterator, Sequence

import uvicorn

from encoder_pod.api.connections import HttpLimits, limited_protocol
from encoder_pod.api.engine import Engine
from encoder_pod.api.http_server import create_app
from encoder_pod.api.lifecycle import Lifecycle
from encoder_pod.discovery.registrar import Registrar, advertised_url
from encoder_pod.errors import EncoderError
from encoder_pod.settings import EncoderSettings
from encoder_pod.transfer.mooncake_engine import local_ip

log = logging.getLogger(__name__)

DrainHook = Callable[[], Awaitable[Any] | None]
"""Called once when a drain starts (e.g. unregistering from SGLang bootstrap servers); may return an awaitable."""

SIGNALS = (signal.SIGTERM, signal.SIGINT)
HOOK_WAIT_S = 5.0
"""Longest the end of a drain waits for what the drain hooks started (each bounds itself too)."""
EXPIRED_ANSWER_S = 1.0
"""After the drain timeout: time for the 503 answers of what was left to be written."""
LINGER_S = 0.5
"""Once drained, the listener stays open this long more: a client whose last answer just came
sends its next request into a 503 (and moves on), not into a closing listener that resets it."""


def build_engine(settings: EncoderSettings) -> Engine:
    """One runtime in this process, or the data-parallel front over worker processes."""
    if settings.parallel.dp_size > 1 or settings.parallel.tp_size > 1:
        from encoder_pod.parallel.front import DataParallelFront

        return DataParallelFront(settings)
    from encoder_pod.runtime import EncoderRuntime

    return EncoderRuntime(settings)


class _Server(uvicorn.Server):
    """uvicorn, driven so that a signal drains first and the listener stays open until the drain ends."""

    def __init__(
        self,
        config: uvicorn.Config,
        engine: Engine,
        lifecycle: Lifecycle,
        drain_timeout: float,
        hooks: Sequence[DrainHook] = (),
        registrar: Registrar | None = None,
    ) -> None:
        super().__init__(config)
        self._engine = engine
        self._lifecycle = lifecycle
        self._drain_timeout = drain_timeout
        # Unregistering from SGLang bootstrap servers is the drain's first step (withdraw is idempotent).
        self._hooks = [registrar.withdraw, *hooks] if registrar is not None else list(hooks)
        self._registrar = registrar
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        self._loop = asyncio.get_running_loop()
        if self._registrar is not None:
            self._loop.create_task(self._registrar.start_when_ready(self._ready), name="register-when-ready")

    async def _ready(self) -> bool:
        """The pod's readiness, as /health says it (answered from state, at once)."""
        if self._lifecycle.draining:
            return False
        try:
            await self._engine.health()
        except EncoderError:
            return False
        return True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, minus re-raising the signal at exit: a finished drain exits 0."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The signal handler: hand the signal to the event loop (drain), never stop uvicorn directly."""
        if self._loop is None:
            self.should_exit = True  # still starting: nothing was admitted yet
            return
        self._loop.call_soon_threadsafe(self._on_signal, sig)

    def _on_signal(self, sig: int) -> None:
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(self._drain_then_exit(sig), name="drain")
            return
        log.warning("%s during the drain: answering what is left with 503 now", signal.Signals(sig).name)
        self._lifecycle.expire()

    async def _drain_then_exit(self, sig: int) -> None:
        try:
            await self._run_drain(sig)
        except Exception:  # noqa: BLE001 - whatever failed, the process must still stop
            log.exception("drain failed; stopping")
            self._lifecycle.expire()
        self.should_exit = True

    async def _run_drain(self, sig: int) -> None:
        lifecycle, engine = self._lifecycle, self._engine
        started = time.monotonic()
        deadline = started + self._drain_timeout
        lifecycle.begin_drain()
        engine.begin_drain()
        log.info(
            "%s: draining (ENCODER_DRAIN_TIMEOUT=%gs): /health 503, new requests 503 + Retry-After, "
            "%d requests in flight finish", signal.Signals(sig).name, self._drain_timeout, lifecycle.inflight,
        )
        started_hooks = [a for a in (self._run_hook(hook) for hook in self._hooks) if a is not None]
        idle = await lifecycle.wait_idle(deadline - time.monotonic()) and await engine.wait_idle(
            deadline - time.monotonic()
        )
        if idle:
            log.info("drained in %.2fs: every admitted request was answered", time.monotonic() - started)
        else:
            log.warning(
                "drain timeout (%gs): %d requests still running are answered 503", self._drain_timeout, lifecycle.inflight
            )
            lifecycle.expire()
            await lifecycle.wait_idle(EXPIRED_ANSWER_S)
        if started_hooks:
            await asyncio.wait(started_hooks, timeout=HOOK_WAIT_S)
        await asyncio.sleep(LINGER_S)
        # uvicorn's shutdown waits this long for responses still being written (large inline answers).
        self.config.timeout_graceful_shutdown = max(1, math.ceil(deadline - time.monotonic()))

    @staticmethod
    def _run_hook(hook: DrainHook) -> asyncio.Future[Any] | None:
        try:
            result = hook()
        except Exception:  # noqa: BLE001 - one failed hook must not stop the drain
            log.exception("drain hook %r failed", hook)
            return None
        return asyncio.ensure_future(result) if result is not None else None


def serve(settings: EncoderSettings, drain_hooks: Sequence[DrainHook] = ()) -> None:
    """Serve until SIGTERM/SIGINT, then drain (see the module docstring) and return."""
    logging.basicConfig(
        level=settings.observability.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log.info("effective settings: %s", settings.masked())
    engine = build_engine(settings)
    lifecycle = Lifecycle()
    app = create_app(settings, engine, lifecycle)
    registrar = None
    if settings.server.register_urls:
        registrar = Registrar(
            settings.server.register_urls,
            advertised_url(settings.server, local_ip),
            check_interval=settings.server.register_check_interval,
        )
        app.state.registrar = registrar
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_level=settings.observability.log_level,
        access_log=False,
        http=limited_protocol(HttpLimits.of(settings.server), settings.server.http_parser),
        loop=settings.server.event_loop,
        timeout_keep_alive=settings.server.http_keepalive_timeout,
    )
    _Server(config, engine, lifecycle, settings.drain_timeout_s(), drain_hooks, registrar).run()
