"""Choosing the transfer backend of each request.

A request without ``prefill_host`` always gets its embedding back inline (clients that are not
prefill servers); one with ``prefill_host`` uses the configured ENCODER_TRANSFER_BACKEND.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from encoder_pod.errors import InvalidRequest
from encoder_pod.protocol import EncodeRequest
from encoder_pod.settings import TransferBackend, TransferSettings
from encoder_pod.offload import Offload
from encoder_pod.transfer.base import InlineTransfer, Transfer

if TYPE_CHECKING:
    from encoder_pod.transfer.zmq_push import ZmqTransfer


class TransferRouter:
    """Holds one instance of each backend in use and picks one per request."""

    def __init__(self, settings: TransferSettings, *, max_registrations: int, offload: Offload) -> None:
        """``max_registrations``: receive URLs held at once (zmq_to_scheduler), the admission bound;
        ``offload``: the threads that build inline answers."""
        self._inline = InlineTransfer(offload)
        self._zmq: ZmqTransfer | None = None
        if settings.encoder_transfer_backend is not TransferBackend.INLINE:
            # Imported here: an inline-only pod never loads the ZMQ machinery.
            from encoder_pod.transfer.zmq_push import ZmqTransfer

            self._zmq = ZmqTransfer(settings, settings.encoder_transfer_backend, max_registrations=max_registrations)

    def for_request(self, request: EncodeRequest) -> Transfer:
        """The backend that delivers this request's embedding; rejects ports that do not fit it."""
        if request.prefill_host is None or self._zmq is None:
            return self._inline
        self._zmq.check(request)
        return self._zmq

    async def register_receive_url(self, payload: dict[str, Any]) -> None:
        """Forward a receive-URL registration to the configured backend."""
        if self._zmq is None:
            raise InvalidRequest("/scheduler_receive_url needs ENCODER_TRANSFER_BACKEND=zmq_to_scheduler (this pod is inline)")
        await self._zmq.register_receive_url(payload)

    async def close(self) -> None:
        """Close every backend."""
        if self._zmq is not None:
            await self._zmq.close()
