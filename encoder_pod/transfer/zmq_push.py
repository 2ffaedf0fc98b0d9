"""The ZMQ backends: ``zmq_to_tokenizer`` (one port) and ``zmq_to_scheduler`` (a port per prefill rank).

A delivery resolves its destinations, builds the frames once (:mod:`encoder_pod.transfer.frames`)
and pushes them to every destination concurrently through the shared :class:`PushSender`, all
within one SEND_TIMEOUT budget. ``/encode`` answers 200 only after every push completed; a
failure names each ``host:port`` that failed and becomes 502 (TransferFailed): the encode itself
worked, the gateway-style hop to the prefill server did not (and that receiver gets nothing of
the part, ever: :mod:`encoder_pod.transfer.push_sender`), and 504 stays reserved for the encoder
being too slow (REQ_TIMEOUT). On any failure the receivers that can still be reached get
an error part for the request, so they stop waiting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from encoder_pod.errors import EncoderError, InternalError, InvalidRequest, TransferFailed
from encoder_pod.models.base import EncodedPart
from encoder_pod.protocol import EncodeRequest
from encoder_pod.settings import TransferBackend, TransferSettings, WireFormat
from encoder_pod.transfer.base import Transfer
from encoder_pod.transfer.frames import FrameCodec, codec_for
from encoder_pod.transfer.push_sender import PushSender, endpoint, host_port
from encoder_pod.transfer.receive_urls import ReceiveUrlTable

log = logging.getLogger(__name__)


def wire_name(settings: TransferSettings) -> str:
    """The ``codec_for`` name of the configured frames: ``encoderpool`` or ``sglang=<version>``."""
    if settings.wire_format is WireFormat.ENCODERPOOL:
        return "encoderpool"
    return f"sglang={settings.sglang_version}"


class ZmqTransfer(Transfer):
    """Pushes embeddings to prefill servers over ZMQ (both backends; they differ in destinations)."""

    def __init__(
        self,
        settings: TransferSettings,
        backend: TransferBackend,
        *,
        max_registrations: int = 1024,
        sender: PushSender | None = None,
        codec: FrameCodec | None = None,
    ) -> None:
        """``max_registrations``: receive URLs held at once (the pod passes its admission bound)."""
        if backend is TransferBackend.INLINE:
            raise ValueError("ZmqTransfer pushes; inline answers in the HTTP response")
        self.name = backend.value
        self._backend = backend
        self._timeout = settings.send_timeout
        self._codec = codec or codec_for(wire_name(settings))
        self._sender = sender or PushSender(
            max_sockets=settings.transfer_max_sockets,
            idle_s=settings.transfer_socket_idle_s,
            linger_s=settings.transfer_linger_s,
        )
        self._table = ReceiveUrlTable(ttl=settings.send_timeout, max_entries=max_registrations)
        # A failed push's destinations and the ones that failed: the error part goes to the others.
        self._after_failure: dict[str, tuple[tuple[str, ...], set[str]]] = {}
        self._background: set[asyncio.Task[None]] = set()

    @property
    def receive_urls(self) -> ReceiveUrlTable:
        """The prefill ranks' registrations (the ``scheduler_receive_url`` operation's state)."""
        return self._table

    @property
    def sender(self) -> PushSender:
        """The socket pool (tests read its open-socket count)."""
        return self._sender

    # --- destinations -----------------------------------------------------------------------
    def check(self, request: EncodeRequest) -> None:
        """Reject, before any work, a request whose ports do not fit this backend."""
        ports = request.ports
        if self._backend is TransferBackend.ZMQ_TO_TOKENIZER and len(ports) != 1:
            got = "none" if not ports else f"{len(ports)}"
            raise InvalidRequest(
                f"field 'embedding_port': zmq_to_tokenizer pushes to exactly one port, got {got}", req_id=request.req_id
            )

    def _registered(self, request: EncodeRequest) -> bool:
        return self._backend is not TransferBackend.ZMQ_TO_TOKENIZER and not request.ports

    async def endpoints(self, request: EncodeRequest, deadline: float) -> tuple[str, ...]:
        """Where this request's embedding goes: its ports, or the receive URLs its ranks register."""
        if self._registered(request):
            return await self._table.wait(request.req_id, deadline - time.monotonic())
        assert request.prefill_host is not None
        return tuple(dict.fromkeys(endpoint(request.prefill_host, p) for p in request.ports))

    # --- pushing ----------------------------------------------------------------------------
    async def _push(self, endpoints: tuple[str, ...], frames: list[Any], deadline: float) -> dict[str, BaseException]:
        timeout = max(deadline - time.monotonic(), 0.001)
        results: list[BaseException | None]
        if len(endpoints) == 1:  # awaited here: gather's task would start it a loop turn later, and end a turn late
            try:
                await self._sender.send(endpoints[0], frames, timeout)
                results = [None]
            except Exception as exc:  # noqa: BLE001 - reported per endpoint, as gather does
                results = [exc]
        else:
            results = await asyncio.gather(*(self._sender.send(ep, frames, timeout) for ep in endpoints), return_exceptions=True)
        failures: dict[str, BaseException] = {}
        for ep, result in zip(endpoints, results):
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, BaseException):
                failures[ep] = result
        return failures

    async def deliver(self, request: EncodeRequest, part: EncodedPart) -> None:
        """Push the embedding to every destination; 200 (None) only once all pushes completed."""
        deadline = time.monotonic() + self._timeout
        await self.push(request, part, await self.endpoints(request, deadline), deadline)

    async def push(self, request: EncodeRequest, part: EncodedPart, endpoints: tuple[str, ...], deadline: float) -> None:
        """Push the embedding to ``endpoints`` within ``deadline``; TransferFailed names those that failed."""
        try:
            frames = self._codec.part_frames(request, part)
        except ValueError as exc:
            raise InternalError(f"embedding of req_id {request.req_id!r} cannot be framed: {exc}", req_id=request.req_id) from None
        failures = await self._push(endpoints, frames, deadline)
        if not failures:
            return None
        self._after_failure[request.req_id] = (endpoints, set(failures))
        reasons = "; ".join(str(getattr(e, "message", e)) for e in failures.values())
        delivered = [host_port(ep) for ep in endpoints if ep not in failures]
        tail = f" (delivered to {', '.join(delivered)})" if delivered else ""
        raise TransferFailed(
            f"push of req_id {request.req_id!r} part {request.part_idx}/{request.num_parts} failed: {reasons}{tail}",
            req_id=request.req_id,
        )

    async def deliver_error(self, request: EncodeRequest, error: EncoderError) -> None:
        """Tell every reachable receiver that this part failed (best effort, bounded by SEND_TIMEOUT)."""
        frames = self._codec.error_frames(request, error)
        known = self._after_failure.pop(request.req_id, None)
        if known is not None:
            endpoints, skip = known
        elif self._registered(request):
            ready = self._table.take_or_defer(request.req_id, lambda eps: self._later(request, eps, frames))
            if ready is None:
                return  # pushed when the ranks register (the HTTP caller is answered now)
            endpoints, skip = ready, set()
        else:
            skip = set()
            endpoints = tuple(dict.fromkeys(endpoint(request.prefill_host or "", p) for p in request.ports))
        await self._push_error(request, tuple(ep for ep in endpoints if ep not in skip), frames)

    async def _push_error(self, request: EncodeRequest, endpoints: tuple[str, ...], frames: list[Any]) -> None:
        if not endpoints:
            return
        failures = await self._push(endpoints, frames, time.monotonic() + self._timeout)
        for ep, err in failures.items():
            log.warning("error part of %r not delivered to %s: %s", request.req_id, host_port(ep), err)

    def _later(self, request: EncodeRequest, endpoints: tuple[str, ...], frames: list[Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._push_error(request, endpoints, frames))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def forget(self, req_id: str) -> None:
        """Drop what is known about ``req_id`` (its embedding went another way)."""
        self._table.discard(req_id)
        self._after_failure.pop(req_id, None)

    async def close(self) -> None:
        """Cancel deferred error pushes and close every socket."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self._sender.close()
