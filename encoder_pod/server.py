"""Running the encoder pod: build the engine for the settings, serve it with uvicorn."""

from __future__ import annotations

import logging
from typing import Any

import uvicorn

from encoder_pod.api.engine import Engine
from encoder_pod.api.http_server import create_app
from encoder_pod.settings import EncoderSettings

log = logging.getLogger(__name__)


def build_engine(settings: EncoderSettings) -> Engine:
    """One runtime in this process, or the data-parallel front over worker processes."""
    if settings.parallel.dp_size > 1 or settings.parallel.tp_size > 1:
        from encoder_pod.parallel.front import DataParallelFront

        return DataParallelFront(settings)
    from encoder_pod.runtime import EncoderRuntime

    return EncoderRuntime(settings)


class _Server(uvicorn.Server):
    """uvicorn, but SIGTERM first answers queued requests (503) before connections drain."""

    def __init__(self, config: uvicorn.Config, engine: Engine) -> None:
        super().__init__(config)
        self._engine = engine

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._engine.begin_shutdown()
        super().handle_exit(sig, frame)


def serve(settings: EncoderSettings) -> None:
    """Serve until SIGTERM/SIGINT."""
    logging.basicConfig(
        level=settings.observability.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log.info("effective settings: %s", settings.masked())
    engine = build_engine(settings)
    app = create_app(settings, engine)
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_level=settings.observability.log_level,
        timeout_graceful_shutdown=int(settings.admission.req_timeout) + 5,
        access_log=False,
    )
    _Server(config, engine).run()
