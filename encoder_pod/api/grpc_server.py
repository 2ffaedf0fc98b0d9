"""The gRPC listener beside HTTP: SGLang's gRPC encoder face, on ``ENCODER_GRPC_PORT``.

One ``grpc.aio`` server on the HTTP server's own event loop (so its handlers call the same
engine, on the same loop, as the routes), serving what SGLang 0.5.23's ``--grpc-mode`` encoder
serves: ``sglang.grpc.encoder.SglangEncoder`` (:mod:`encoder_pod.api.grpc_encoder`),
``grpc.health.v1.Health`` (:mod:`encoder_pod.api.grpc_health`) and server reflection listing
the three, with SGLang's message size limits (256 MiB each way).

It lives and dies with the HTTP server: started once the engine has begun loading (health says
NOT_SERVING until the model is ready), and through a drain the same :class:`Lifecycle` governs
both faces: health turns NOT_SERVING, new ``Encode`` calls are refused UNAVAILABLE, the calls
already running finish (the drain waits for them as for ``/encode``), and the listener closes
only when the HTTP server shuts down.
"""

from __future__ import annotations

import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from smg_grpc_proto import sglang_encoder_pb2 as pb
from smg_grpc_proto import sglang_encoder_pb2_grpc as pb_grpc

from encoder_pod.api.engine import Engine
from encoder_pod.api.grpc_encoder import SglangEncoderFace
from encoder_pod.api.grpc_health import HealthFace
from encoder_pod.api.lifecycle import Lifecycle
from encoder_pod.metrics import EdgeMetrics
from encoder_pod.settings import EncoderSettings

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""Largest request and response message, each way (SGLang's gRPC encoder's limits)."""

SERVICE_NAMES = (
    pb.DESCRIPTOR.services_by_name["SglangEncoder"].full_name,
    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
    reflection.SERVICE_NAME,
)
"""What reflection lists: the three services SGLang's gRPC encoder registers."""


class GrpcFace:
    """The gRPC server of one pod: build it, start it on the running loop, stop it."""

    def __init__(self, settings: EncoderSettings, engine: Engine, lifecycle: Lifecycle, edge: EdgeMetrics) -> None:
        """``edge``: the HTTP edge's answer counters, which count ``Encode`` calls too."""
        self._address = f"{_host(settings.server.host)}:{settings.server.grpc_port}"
        self._encoder = SglangEncoderFace(settings, engine, lifecycle, edge)
        self._health = HealthFace(engine, lifecycle)
        self._server: grpc.aio.Server | None = None
        self.port: int | None = None

    async def start(self) -> None:
        """Bind and serve on the running loop (a grpc.aio server belongs to the loop it is built on);
        raises OSError naming the address when the port cannot be bound."""
        server = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),  # a second pod on the same port must fail, not share it
            ]
        )
        pb_grpc.add_SglangEncoderServicer_to_server(self._encoder, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(SERVICE_NAMES, server)
        try:
            self.port = server.add_insecure_port(self._address)
        except RuntimeError as exc:  # grpc reports a failed bind as a RuntimeError
            raise OSError(f"cannot bind the gRPC port {self._address} (ENCODER_GRPC_PORT): {exc}") from None
        await server.start()
        self._server = server
        log.info("gRPC (sglang.grpc.encoder.SglangEncoder, grpc.health.v1, reflection) on %s", self._address)

    async def stop(self, grace: float) -> None:
        """Close the listener; calls still running get ``grace`` seconds, then are cancelled."""
        if self._server is not None:
            await self._server.stop(grace)


def _host(host: str) -> str:
    """``host`` as a gRPC address part (IPv6 literals in brackets; an empty host is every address)."""
    if not host:
        return "[::]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
