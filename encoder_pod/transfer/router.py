"""Choosing the transfer backend of each request, as SGLang's prefill side asks for it.

A request without ``prefill_host`` gets its embedding back inline (clients that are not prefill
servers). With ``prefill_host``, TRANSFER_BACKEND decides:

- ``auto`` (the default) serves whatever an SGLang prefill server sends, so a pod needs no
  transfer setting: an ``embedding_port`` (zmq_to_tokenizer; a list = one port per rank) is
  pushed to; ``embedding_port: null`` waits for the prefill ranks to say where: receive URLs
  (``/scheduler_receive_url``, zmq_to_scheduler, SGLang's own ``auto``) or a mooncake pull
  (``/scheduler_receive_meta_data``), whichever comes first.
- ``zmq_to_tokenizer``, ``zmq_to_scheduler`` and ``mooncake`` do only what SGLang's encoder does
  with that setting.
- ``inline`` never pushes: a request naming a prefill target is refused (400) rather than
  answered with a body its receiver never reads.

The prefill ranks' calls back (receive URLs, mooncake's pulls) arrive as :meth:`TransferRouter.control`
by name: the operation declared in :mod:`~encoder_pod.transfer.registry` is refused with its one
message unless this pod's backend serves it, else run on the object that holds its state.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from encoder_pod.errors import EncoderError, InternalError, InvalidRequest, TransferFailed
from encoder_pod.models.base import EncodedPart
from encoder_pod.protocol import EncodeRequest
from encoder_pod.settings import TransferBackend, TransferSettings
from encoder_pod.transfer.base import InlineTransfer, Transfer
from encoder_pod.transfer.mooncake import MooncakeStaging
from encoder_pod.transfer.mooncake_engine import MooncakeEngine, engine_hostname
from encoder_pod.transfer.registry import control_op
from encoder_pod.transfer.sglang_frames import SglangCodec
from encoder_pod.transfer.zmq_push import ZmqTransfer


class MooncakeTransfer(Transfer):
    """``mooncake``: stage the embedding for the ranks' pulls and answer /encode with its sizes."""

    name = "mooncake"

    def __init__(self, staging: MooncakeStaging) -> None:
        self.staging = staging

    async def deliver(self, request: EncodeRequest, part: EncodedPart) -> None:
        """Stage; the ranks' /send calls move the bytes (/encode answers ``null``: SGLang reads only the status)."""
        self.staging.stage(request, part)

    async def deliver_error(self, request: EncodeRequest, error: EncoderError) -> None:
        """The ranks' pulls get the error."""
        self.staging.stage_error(request, error)


class PulledTransfer(Transfer):
    """``auto`` with ``embedding_port: null``: zmq_to_scheduler registrations or a mooncake pull, whichever comes."""

    name = "auto"

    def __init__(self, zmq: ZmqTransfer, staging: MooncakeStaging, timeout: float) -> None:
        self._zmq = zmq
        self._staging = staging
        self._timeout = timeout

    async def deliver(self, request: EncodeRequest, part: EncodedPart) -> None:
        """Stage for mooncake and wait for registrations; the first way the ranks ask for it wins."""
        deadline = time.monotonic() + self._timeout
        self._staging.stage(request, part)
        registered = asyncio.ensure_future(self._zmq.endpoints(request, deadline))
        pulled = asyncio.ensure_future(self._staging.claimed(request.req_id, deadline - time.monotonic()))
        try:
            await asyncio.wait({registered, pulled}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # The caller went (an HTTP client disconnected, a gRPC call was cancelled): nobody will
            # ask for this part, and its req_id must be free for a retry at once.
            self._staging.discard(request.req_id)
            self._zmq.forget(request.req_id)
            raise
        finally:
            for task in (registered, pulled):
                if not task.done():
                    task.cancel()
            await asyncio.gather(registered, pulled, return_exceptions=True)
        if not pulled.cancelled() and pulled.exception() is None:
            self._zmq.forget(request.req_id)
            return None
        self._staging.discard(request.req_id)
        if registered.cancelled():
            raise TransferFailed(
                f"no prefill rank asked for this embedding within {self._timeout:g}s (ENCODER_SEND_TIMEOUT): "
                "neither /scheduler_receive_url registrations nor a mooncake /scheduler_receive_meta_data pull came",
                req_id=request.req_id,
            )
        await self._zmq.push(request, part, registered.result(), deadline)  # result() re-raises a failed wait
        return None

    async def deliver_error(self, request: EncodeRequest, error: EncoderError) -> None:
        """Both kinds of rank learn of the failure: pulls get it, registrations get an error part."""
        self._staging.stage_error(request, error)
        await self._zmq.deliver_error(request, error)


class TransferRouter:
    """Holds one instance of each backend in use and picks one per request."""

    def __init__(self, settings: TransferSettings, *, max_registrations: int, bind_host: str = "") -> None:
        """``max_registrations``: receive URLs and staged mooncake parts held at once (the admission bound);
        ``bind_host``: the HTTP bind address (mooncake names the pod by it unless it is a wildcard)."""
        self.backend = settings.transfer_backend
        self._inline = InlineTransfer()
        self._zmq: ZmqTransfer | None = None
        self._staging: MooncakeStaging | None = None
        self._pulled: Transfer | None = None
        self._owners: list[object] = []
        """The objects whose state control operations work on (each op names its owner's class)."""
        if self.backend is TransferBackend.INLINE:
            return
        self._zmq = ZmqTransfer(settings, self.backend, max_registrations=max_registrations)
        self._owners.append(self._zmq.receive_urls)
        if self.backend in (TransferBackend.AUTO, TransferBackend.MOONCAKE):
            engine = MooncakeEngine(
                engine_hostname(settings.mooncake_hostname, bind_host), settings.mooncake_protocol, settings.mooncake_device
            )
            self._staging = MooncakeStaging(
                engine, self._zmq.sender, SglangCodec(settings.sglang_version), ttl=settings.send_timeout,
                max_entries=2 * max_registrations,  # in flight, plus staged parts whose ranks have not sent yet
            )
            self._owners.append(self._staging)
            if self.backend is TransferBackend.MOONCAKE:
                self._pulled = MooncakeTransfer(self._staging)
            else:
                self._pulled = PulledTransfer(self._zmq, self._staging, settings.send_timeout)

    @property
    def delivering(self) -> list[str]:
        """The names (``encoder_delivery_*``'s ``backend`` label) of the backends that deliver to a prefill side."""
        return [t.name for t in (self._zmq, self._pulled) if t is not None]

    def for_request(self, request: EncodeRequest) -> Transfer:
        """The backend that delivers this request's embedding; refuses (400) what cannot be delivered."""
        if request.prefill_host is None:
            return self._inline
        if self._zmq is None:
            raise InvalidRequest(
                "this pod's transfer backend is inline (ENCODER_TRANSFER_BACKEND=inline): it cannot deliver to "
                f"prefill_host {request.prefill_host!r}; use auto (the default) or the backend the prefill server uses",
                req_id=request.req_id,
            )
        if request.ports or self._pulled is None:
            self._zmq.check(request)
            return self._zmq
        return self._pulled

    async def control(self, name: str, payload: dict[str, Any]) -> Any:
        """Run the control operation ``name`` (:mod:`~encoder_pod.transfer.registry`) on the backend
        that holds its state; refused with the operation's one message unless this pod's backend serves it."""
        op = control_op(name)
        op.check(self.backend)
        owner = next((o for o in self._owners if isinstance(o, op.owner)), None)
        if owner is None:
            raise InternalError(f"{op.path}: the {self.backend.value} backend declares it but holds no {op.owner.__name__}")
        return await op.handler(owner, payload)

    async def close(self) -> None:
        """Close every backend."""
        if self._staging is not None:
            self._staging.close()
        if self._zmq is not None:
            await self._zmq.close()
