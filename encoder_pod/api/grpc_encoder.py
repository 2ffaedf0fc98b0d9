"""SGLang's gRPC encoder service, ``sglang.grpc.encoder.SglangEncoder``, over the pod's one engine.

The messages are smg-grpc-proto's own generated classes (the package SGLang 0.5.23's gRPC encoder
and its clients import); nothing here copies the proto. Each call becomes what its HTTP twin
sends, and goes down the same path: ``Encode`` is an ``/encode`` body handed to
``engine.encode`` (the same parser, admission, batching, cache, transfer backends and drain),
``Send`` is mooncake's ``/send``, ``SchedulerReceiveUrl`` is ``/scheduler_receive_url``. Errors
are the engine's typed ones, answered through ONE table (:mod:`encoder_pod.api.grpc_errors`).

What each ``Encode`` field means, as SGLang 0.5.23's gRPC encoder reads it:

- ``mm_items``, ``req_id``, ``num_parts``, ``part_idx``: as ``/encode`` (proto3 sends 0 for an
  unset ``num_parts``, which is refused INVALID_ARGUMENT naming the field, as SGLang refuses it);
- ``prefill_host``: required: the response carries no embedding, so it must go somewhere;
- ``embedding_port``: the ports to push to (``zmq_to_tokenizer`` takes one, ``zmq_to_scheduler``
  one per prefill rank); none = wait for ``SchedulerReceiveUrl`` registrations. A pod configured
  for ``mooncake`` ignores it (as SGLang does) and answers ``embedding_size/len/dim``; ``Send``
  then writes the part into the rank's buffer and releases it, as SGLang's ``Send`` does.

The modality: SGLang's proto has no field for it and SGLang's server takes every ``Encode`` as
IMAGE; so does this pod, unless the call's metadata says otherwise: ``encoderpool-modality:
AUDIO`` (or ``VIDEO``, ``IMAGE``; case-insensitive) encodes the items as that modality, within the
proto as it is (SGLang's clients never send the key and get images, as from SGLang).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, TypeVar

import grpc
from smg_grpc_proto import sglang_encoder_pb2 as pb
from smg_grpc_proto import sglang_encoder_pb2_grpc as pb_grpc

from encoder_pod.api.answer_counts import count_answer
from encoder_pod.api.engine import Engine
from encoder_pod.api.grpc_errors import refusal
from encoder_pod.api.lifecycle import Lifecycle
from encoder_pod.errors import EncoderError, InvalidRequest
from encoder_pod.metrics import EdgeMetrics, GrpcMetrics
from encoder_pod.settings import EncoderSettings, TransferBackend

T = TypeVar("T")

MODALITY_KEY = "encoderpool-modality"
"""Call metadata naming the items' modality (IMAGE when absent, as SGLang's gRPC encoder)."""


def _modality(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == MODALITY_KEY:
            return str(value)
    return "IMAGE"


def encode_body(request: pb.EncodeRequest, modality: str, backend: TransferBackend) -> dict[str, Any]:
    """The ``/encode`` body an ``EncodeRequest`` stands for (proto3's empty values as absent ones)."""
    if not request.prefill_host.strip():
        raise InvalidRequest(
            "field 'prefill_host': required over gRPC (an EncodeResponse carries no embedding; it is pushed to the prefill side)",
            req_id=request.req_id or None,
        )
    ports = list(request.embedding_port)
    return {
        "req_id": request.req_id,
        "modality": modality,
        "mm_items": list(request.mm_items),
        "num_parts": request.num_parts,
        "part_idx": request.part_idx,
        "prefill_host": request.prefill_host,
        # mooncake moves the bytes on Send; the ports SGLang's clients fill in are not used (as in SGLang).
        "embedding_port": ports if ports and backend is not TransferBackend.MOONCAKE else None,
    }


def _required(value: Any, name: str, req_id: str) -> Any:
    if not value:
        raise InvalidRequest(f"field '{name}': required", req_id=req_id or None)
    return value


def send_body(request: pb.SendRequest) -> dict[str, Any]:
    """The mooncake ``/send`` body a ``SendRequest`` stands for; one receiver per part (as SGLang's ``Send``)."""
    req_id = request.req_id
    return {
        "req_id": _required(req_id, "req_id", req_id),
        "prefill_host": _required(request.prefill_host, "prefill_host", req_id),
        "embedding_port": _required(request.embedding_port, "embedding_port", req_id),
        "session_id": _required(request.session_id, "session_id", req_id),
        "buffer_address": _required(request.buffer_address, "buffer_address", req_id),
        "receive_count": 1,
    }


def registration_body(request: pb.SchedulerReceiveUrlRequest) -> dict[str, Any]:
    """The ``/scheduler_receive_url`` body a ``SchedulerReceiveUrlRequest`` stands for."""
    return {"req_id": request.req_id, "receive_url": request.receive_url, "receive_count": request.receive_count}


class SglangEncoderFace(pb_grpc.SglangEncoderServicer):
    """``Encode``, ``Send`` and ``SchedulerReceiveUrl`` over one :class:`Engine` (single process or DP front)."""

    def __init__(self, settings: EncoderSettings, engine: Engine, lifecycle: Lifecycle, edge: EdgeMetrics) -> None:
        self._engine = engine
        self._lifecycle = lifecycle
        self._backend = settings.transfer.transfer_backend
        self._drain_timeout = settings.drain_timeout_s()
        self._metrics = GrpcMetrics(engine.registry)
        self._edge = edge  # Encode counts in encoder_requests_total as /encode does (api.answer_counts)

    async def Encode(  # noqa: N802 - the generated servicer's method name
        self, request: pb.EncodeRequest, context: grpc.aio.ServicerContext
    ) -> pb.EncodeResponse:
        """Encode the items and deliver the embedding; the sizes when the pod stages for mooncake."""
        lifecycle = self._lifecycle
        if lifecycle.draining:  # new work during a drain; calls that arrived before go on
            return await self._call("Encode", context, self._refuse(lifecycle.refusal()))
        lifecycle.enter()
        try:
            return await self._call("Encode", context, self._until_stopped(self._encode(request, context)))
        finally:
            lifecycle.leave()

    async def _encode(self, request: pb.EncodeRequest, context: grpc.aio.ServicerContext) -> pb.EncodeResponse:
        body = encode_body(request, _modality(context), self._backend)
        await self._engine.encode(body)  # None: the ZMQ backends pushed, mooncake staged
        if self._backend is not TransferBackend.MOONCAKE:
            return pb.EncodeResponse()
        sizes = await self._engine.control("scheduler_receive_meta_data", {"req_id": request.req_id, "part_idx": request.part_idx})
        return pb.EncodeResponse(
            embedding_size=sizes["embedding_size"], embedding_len=sizes["embedding_len"], embedding_dim=sizes["embedding_dim"]
        )

    async def Send(  # noqa: N802 - the generated servicer's method name
        self, request: pb.SendRequest, context: grpc.aio.ServicerContext
    ) -> pb.SendResponse:
        """mooncake: write the staged part into the rank's buffer, acknowledge it over ZMQ, release it."""

        async def send() -> pb.SendResponse:
            await self._engine.control("send", send_body(request))
            return pb.SendResponse()

        return await self._call("Send", context, send())

    async def SchedulerReceiveUrl(  # noqa: N802 - the generated servicer's method name
        self, request: pb.SchedulerReceiveUrlRequest, context: grpc.aio.ServicerContext
    ) -> pb.SchedulerReceiveUrlResponse:
        """zmq_to_scheduler: register where a prefill rank receives a request's embedding."""

        async def register() -> pb.SchedulerReceiveUrlResponse:
            await self._engine.control("scheduler_receive_url", registration_body(request))
            return pb.SchedulerReceiveUrlResponse()

        return await self._call("SchedulerReceiveUrl", context, register())

    # --- one way of answering ---------------------------------------------------------------
    @staticmethod
    async def _refuse(error: EncoderError) -> Any:
        raise error

    async def _call(self, method: str, context: grpc.aio.ServicerContext, work: Awaitable[T]) -> T:
        """``work``'s result, or the error table's status for what it raised (the call ends there)."""
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        failed: BaseException | None = None
        try:
            try:
                return await work
            except asyncio.CancelledError as exc:
                code, failed = grpc.StatusCode.CANCELLED, exc  # the client went (or its deadline passed): nobody reads an answer
                raise
            except Exception as exc:  # noqa: BLE001 - every failure is answered by the error table
                failed = exc
                answer = refusal(exc)
                code = answer.code
                context.set_trailing_metadata(answer.metadata)
                await context.abort(answer.code, answer.details)
                raise AssertionError("unreachable: abort raises") from None
        finally:
            self._metrics.calls.labels(method=method, code=code.name).inc()
            self._metrics.call_latency.labels(method=method).observe(time.perf_counter() - started)
            if method == "Encode":  # Send and SchedulerReceiveUrl are /send's and /scheduler_receive_url's twins: not counted there
                count_answer(self._edge, failed, started)

    async def _until_stopped(self, work: Awaitable[T]) -> T:
        """``work`` in this task, answered 503-style (UNAVAILABLE) if the drain runs out of time first.

        A client that cancels (or whose deadline passes) cancels this task: the engine releases
        what the request held (its admission slot, its place in the queue) as for an HTTP client
        that disconnects.
        """
        task = asyncio.current_task()
        assert task is not None
        expired_now: list[bool] = []

        def on_expiry(future: asyncio.Future[Any]) -> None:
            if not future.cancelled() and not expired_now:
                expired_now.append(True)
                task.cancel()

        expired = self._lifecycle.expired
        expired.add_done_callback(on_expiry)
        try:
            return await work
        except asyncio.CancelledError:
            if not expired_now or task.cancelling() > 1:
                raise  # the client went, or the server itself is stopping this task
            task.uncancel()
            raise self._lifecycle.expiry_error(self._drain_timeout) from None
        finally:
            expired_now.append(False)  # answered: the expiry may no longer cancel this task
            expired.remove_done_callback(on_expiry)

