"""Running the encoder pod: build the engine for the settings, serve it with uvicorn."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import uvicorn

from encoder_pod.api.engine import Engine
from encoder_pod.api.http_server import create_app
from encoder_pod.discovery.registrar import WITHDRAW_TIMEOUT_S, Registrar, advertised_url
from encoder_pod.errors import EncoderError
from encoder_pod.settings import EncoderSettings
from encoder_pod.transfer.mooncake_engine import local_ip

log = logging.getLogger(__name__)


def build_engine(settings: EncoderSettings) -> Engine:
    """One runtime in this process, or the data-parallel front over worker processes."""
    if settings.parallel.dp_size > 1 or settings.parallel.tp_size > 1:
        from encoder_pod.parallel.front import DataParallelFront

        return DataParallelFront(settings)
    from encoder_pod.runtime import EncoderRuntime

    return EncoderRuntime(settings)


class _Server(uvicorn.Server):
    """uvicorn, but SIGTERM first answers queued requests (503) and unregisters from SGLang before connections drain."""

    def __init__(self, config: uvicorn.Config, engine: Engine, registrar: Registrar | None = None) -> None:
        super().__init__(config)
        self._engine = engine
        self._registrar = registrar
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        self._loop = asyncio.get_running_loop()
        if self._registrar is not None:
            self._loop.create_task(self._registrar.start_when_ready(self._ready), name="register-when-ready")

    async def _ready(self) -> bool:
        try:
            await self._engine.health()
        except EncoderError:
            return False
        return True

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._engine.begin_shutdown()
        if self._registrar is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._registrar.withdraw)  # the start of the drain
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: Any = None) -> None:
        await super().shutdown(sockets)
        if self._registrar is not None:
            await asyncio.wait_for(asyncio.shield(self._registrar.withdraw()), WITHDRAW_TIMEOUT_S + 1)


def serve(settings: EncoderSettings) -> None:
    """Serve until SIGTERM/SIGINT."""
    logging.basicConfig(
        level=settings.observability.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log.info("effective settings: %s", settings.masked())
    engine = build_engine(settings)
    app = create_app(settings, engine)
    registrar = None
    if settings.server.register_urls:
        registrar = Registrar(settings.server.register_urls, advertised_url(settings.server, local_ip),
                              check_interval=settings.server.register_check_interval)
        app.state.registrar = registrar  # Registrar.withdraw() is the drain's first step (idempotent)
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_level=settings.observability.log_level,
        timeout_graceful_shutdown=int(settings.admission.req_timeout) + 5,
        access_log=False,
    )
    _Server(config, engine, registrar).run()
