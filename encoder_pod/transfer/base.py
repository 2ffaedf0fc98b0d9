"""The transfer backend contract, and the ``inline`` backend (no sockets: the answer is the response)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from encoder_pod.errors import EncoderError
from encoder_pod.models.base import EncodedPart
from encoder_pod.protocol import EncodeRequest
from encoder_pod.transfer.inline import InlineAnswer


class Transfer(ABC):
    """Delivers one request's embedding (or its error) to whoever waits for it."""

    name: str

    @abstractmethod
    async def deliver(self, request: EncodeRequest, part: EncodedPart) -> InlineAnswer | None:
        """Deliver the embedding; the inline answer, or None once pushed (the ZMQ backends answer ``null``)."""

    async def deliver_error(self, request: EncodeRequest, error: EncoderError) -> None:
        """Tell the receiver this request failed, so it stops waiting (no-op for inline)."""
        return None

    async def close(self) -> None:
        """Release sockets and threads."""
        return None


class InlineTransfer(Transfer):
    """The ``inline`` backend: the embedding comes back in the response (rendered by the HTTP edge)."""

    name = "inline"

    async def deliver(self, request: EncodeRequest, part: EncodedPart) -> InlineAnswer:
        """The answer carrying the embedding (:class:`~encoder_pod.transfer.inline.InlineAnswer`; no copy, no thread)."""
        return InlineAnswer.build(request, part)
