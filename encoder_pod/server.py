"""Running the encoder pod: build the engine for the settings, serve it with uvicorn, drain on SIGTERM.

SIGTERM (or SIGINT) hands over to the pod's drain (:class:`encoder_pod.drain.Drain`, which owns
every step) BEFORE uvicorn's own shutdown, which would close the listening socket at once and
with it every connection the kernel had queued. Here are only the parts of the drain that touch
uvicorn: the signal handlers, and the listener and connections closed as the drain says
(:class:`_Server` is its :class:`~encoder_pod.drain.Listener`). When the drain is over, uvicorn
shuts down as usual (nothing is left for it to close), the engine stops and the process exits 0.

A model that does not load stops uvicorn the same way (nothing was admitted: nothing is drained)
and :func:`serve` raises :class:`~encoder_pod.errors.ModelLoadFailed`, so the CLI exits
``MODEL_LOAD_FAILED`` with the reason rather than the pod staying up unready: in one process, any
failure of the load (a refused checkpoint names its model type); behind the data-parallel front, a
worker whose load refused the checkpoint, or a rank given up after ENCODER_DP_MAX_FAILED_STARTS.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import select
import signal
import socket
import struct
import sys
import threading
import time
from types import FrameType
from typing import Any, Callable, Iterator, Sequence

import uvicorn

from encoder_pod.api.connections import HttpLimits, limited_protocol
from encoder_pod.api.engine import Engine
from encoder_pod.api.http_server import create_app
from encoder_pod.api.lifecycle import Lifecycle, check_ready
from encoder_pod.drain import Drain, DrainHook
from encoder_pod.discovery.registrar import Registrar, advertised_url
from encoder_pod.errors import EncoderError, ModelLoadFailed
from encoder_pod.settings import EncoderSettings
from encoder_pod.transfer.mooncake_engine import local_ip

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)

SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)
"""Linux's setsockopt for a classic BPF socket filter (unprivileged)."""
_DROP_EVERY_PACKET = struct.pack("HBBI", 0x06, 0, 0, 0)
"""One BPF instruction, ``ret #0``: keep 0 bytes of every packet, i.e. drop it. On a listening
socket the kernel runs the filter on SYNs and on the ACK that ends a handshake, so no new
connection is completed (the client's SYN goes unanswered and is retried; by then the port is
closed and the retry is refused: nothing of a request was sent)."""
ACCEPT_QUEUE_S = 2.0
"""Longest :meth:`_Server.stop_accepting` waits for the event loop to accept what the kernel queued."""


def build_engine(settings: EncoderSettings, on_load_failed: Callable[[ModelLoadFailed], None] | None = None) -> Engine:
    """One runtime in this process, or the data-parallel front over worker processes; either calls
    ``on_load_failed`` (on the event loop) when the pod's model cannot be loaded."""
    if settings.parallel.dp_size > 1 or settings.parallel.tp_size > 1:
        from encoder_pod.parallel.front import DataParallelFront

        return DataParallelFront(settings, on_load_failed=on_load_failed)
    from encoder_pod.runtime import EncoderRuntime

    return EncoderRuntime(settings, on_load_failed=on_load_failed)


def _complete_no_handshake(sock: Any) -> bool:
    """Let the kernel complete no more TCP handshakes on listening ``sock``; False where it cannot (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    program = ctypes.create_string_buffer(_DROP_EVERY_PACKET, len(_DROP_EVERY_PACKET))
    # struct sock_fprog { unsigned short len; struct sock_filter *filter; }: the kernel copies it at once.
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, struct.pack("HP", 1, ctypes.addressof(program)))
    return True


def _queued(sock: Any) -> bool:
    """True while completed connections wait in ``sock``'s accept queue (the listening socket is readable)."""
    readable, _, _ = select.select([sock.fileno()], [], [], 0)
    return bool(readable)


class _Server(uvicorn.Server):
    """uvicorn, driven so that a signal starts the pod's :class:`~encoder_pod.drain.Drain`; the
    listener and the connections close as the drain says (the :class:`~encoder_pod.drain.Listener`)."""

    def __init__(self, config: uvicorn.Config, engine: Engine, drain: Drain, registrar: Registrar | None = None) -> None:
        super().__init__(config)
        self._engine = engine
        self._drain = drain
        self._registrar = registrar
        self._loop: asyncio.AbstractEventLoop | None = None
        self.load_failure: ModelLoadFailed | None = None
        """Set by :meth:`load_failed`: why the model cannot be served (:func:`serve` raises it once stopped)."""

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        self._loop = asyncio.get_running_loop()
        if self._registrar is not None:
            self._loop.create_task(self._registrar.start_when_ready(self._ready), name="register-when-ready")

    async def _ready(self) -> bool:
        """The pod's readiness, as /health says it (answered from state, at once)."""
        try:
            await check_ready(self._engine, self._drain.lifecycle)
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
        """The signal handler: hand the signal to the drain on the event loop, never stop uvicorn directly."""
        if self._loop is None:
            self.should_exit = True  # still starting: nothing was admitted yet
            return
        self._loop.call_soon_threadsafe(self._drain.on_signal, sig, self, self._drained)

    def load_failed(self, exc: ModelLoadFailed) -> None:
        """The model did not load (called on the event loop): stop now, nothing was admitted."""
        if self.load_failure is None:  # the first reason is the one the CLI prints
            self.load_failure = exc
        self.config.timeout_graceful_shutdown = 1  # a client's idle keep-alive connection does not hold the exit
        self.should_exit = True

    def _drained(self) -> None:
        # uvicorn's own shutdown finds no listener and no connection left; it stops the app (the engine).
        self.config.timeout_graceful_shutdown = 1
        self.should_exit = True

    # --- the drain's Listener -------------------------------------------------------------
    async def stop_accepting(self) -> None:
        """No new handshake completes, what the kernel queued is accepted (and answered), then the socket closes."""
        sockets = [sock for server in self.servers for sock in (server.sockets or ())]
        filtered = [sock for sock in sockets if _complete_no_handshake(sock)]
        deadline = time.monotonic() + ACCEPT_QUEUE_S
        while filtered and any(_queued(sock) for sock in filtered) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # the loop's accept handler takes them
        for server in self.servers:
            server.close()

    async def close_connections(self, idle_grace: float, deadline: float) -> int:
        """Close each connection once it is quiet: no request in progress and nothing received for
        ``idle_grace`` s. A request that arrives meanwhile is answered (503 + ``Connection: close``:
        that answer closes its connection); at ``deadline`` whatever is open is left to uvicorn."""
        connections = self.server_state.connections
        while connections and time.monotonic() < deadline:
            for connection in list(connections):
                quiet_for = getattr(connection, "quiet_for", None)  # a protocol of ours (api.connections) has it
                if quiet_for is None or quiet_for() >= idle_grace:
                    connection.shutdown()
            await asyncio.sleep(0.05)
        return len(connections)


def serve(settings: EncoderSettings, drain_hooks: Sequence[DrainHook] = ()) -> None:
    """Serve until SIGTERM/SIGINT, then drain (see the module docstring) and return; raises
    :class:`~encoder_pod.errors.ModelLoadFailed` when the model did not load (the server has stopped)."""
    logging.basicConfig(
        level=settings.observability.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log.info("effective settings: %s", settings.masked())

    def load_failed(exc: ModelLoadFailed) -> None:
        server.load_failed(exc)  # the load runs only once the server below runs

    engine = build_engine(settings, load_failed)
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
    hooks = [registrar.withdraw, *drain_hooks] if registrar is not None else list(drain_hooks)  # unregister first
    drain = Drain(lifecycle, engine, settings.drain_timeout_s(), hooks)
    server = _Server(config, engine, drain, registrar)
    server.run()
    if server.load_failure is not None:
        raise server.load_failure
