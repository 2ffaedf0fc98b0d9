"""Choosing the transfer backend of each request.

A request without ``prefill_host`` always gets its embedding back inline (clients that are not
prefill servers); one with ``prefill_host`` uses the configured ENCODER_TRANSFER_BACKEND.
"""

from __future__ import annotations

from typing import Any

from encoder_pod.errors import InvalidRequest
from encoder_pod.protocol import EncodeRequest
from encoder_pod.settings import EncoderSettings, TransferBackend
from encoder_pod.transfer.base import Transfer
from encoder_pod.transfer.inline import InlineTransfer


class TransferRouter:
    """Holds one instance of each backend in use and picks one per request."""

    def __init__(self, settings: EncoderSettings) -> None:
        self._settings = settings
        self._inline = InlineTransfer()
        self._configured: Transfer | None = self._inline if settings.encoder_transfer_backend is TransferBackend.INLINE else None

    def for_request(self, request: EncodeRequest) -> Transfer:
        """The backend that delivers this request's embedding."""
        if request.prefill_host is None or self._configured is self._inline:
            return self._inline
        if self._configured is None:
            raise InvalidRequest(
                f"transfer backend {self._settings.encoder_transfer_backend.value} is not available in this build"
            )
        return self._configured

    async def register_receive_url(self, payload: dict[str, Any]) -> None:
        """Forward a receive-URL registration to the configured backend."""
        await (self._configured or self._inline).register_receive_url(payload)

    async def close(self) -> None:
        """Close every backend."""
        if self._configured is not None and self._configured is not self._inline:
            await self._configured.close()
