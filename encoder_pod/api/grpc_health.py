"""``grpc.health.v1.Health`` over the pod's one readiness verdict (the one ``/health`` answers).

SERVING exactly when ``/health`` would answer 200 (:func:`~encoder_pod.api.lifecycle.check_ready`:
the model loaded, a real encode succeeded recently, not draining), NOT_SERVING otherwise; both
from state, at once, so a Kubernetes ``grpc`` probe costs no model work. The services answered
are SGLang's gRPC encoder's: ``""`` (the whole server) and ``sglang.grpc.encoder.SglangEncoder``;
plus ``encoderpool.liveness``, ``/livez``'s twin: SERVING whenever the event loop answers (touches
no engine, queue or model), for a liveness probe that never restarts a busy or loading pod. Any
other name is NOT_FOUND (``Check``) or SERVICE_UNKNOWN (``Watch``), as the health protocol says.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from encoder_pod.api.engine import Engine
from encoder_pod.api.lifecycle import Lifecycle, check_ready
from encoder_pod.errors import EncoderError

ENCODER_SERVICE = "sglang.grpc.encoder.SglangEncoder"
READINESS = ("", ENCODER_SERVICE)
"""The names whose status is the readiness verdict (SGLang's gRPC encoder registers the same two)."""
LIVENESS = "encoderpool.liveness"
"""The name whose status is SERVING while this process's event loop answers (``/livez``)."""
SERVICES = (*READINESS, LIVENESS)
WATCH_POLL_S = 0.5
"""How often a ``Watch`` stream looks at the verdict (it sends only changes)."""

class HealthFace(health_pb2_grpc.HealthServicer):
    """The health service: the verdict of ``/health``, as gRPC health statuses."""

    def __init__(self, engine: Engine, lifecycle: Lifecycle) -> None:
        self._engine = engine
        self._lifecycle = lifecycle

    async def status(self, service: str = "") -> int:
        """SERVING when ``/health`` would be 200 (for :data:`LIVENESS`: always), else NOT_SERVING."""
        if service == LIVENESS:
            return health_pb2.HealthCheckResponse.SERVING
        try:
            await check_ready(self._engine, self._lifecycle)
        except EncoderError:
            return health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse.SERVING

    async def Check(  # noqa: N802 - the generated servicer's method name
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        """The verdict now; NOT_FOUND for a service this server does not have."""
        if request.service not in SERVICES:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}; this server has {SERVICES}")
        return health_pb2.HealthCheckResponse(status=await self.status(request.service))

    async def Watch(  # noqa: N802 - the generated servicer's method name
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        """The verdict now, then each change, until the client goes (or the server stops)."""
        if request.service not in SERVICES:
            yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            return
        last = None
        while True:
            now = await self.status(request.service)
            if now != last:
                yield health_pb2.HealthCheckResponse(status=now)
                last = now
            await asyncio.sleep(WATCH_POLL_S)
