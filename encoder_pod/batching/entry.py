"""A request waiting for its share of a batch, and how failures become typed errors."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from encoder_pod.errors import EncoderError, InternalError, InvalidRequest
from encoder_pod.modality import Modality
from encoder_pod.models.base import EncodedPart, MediaItem
from encoder_pod.protocol import EncodeRequest


@dataclass(eq=False)
class PendingEntry:
    """One admitted, decoded request; its future resolves to its :class:`EncodedPart`."""

    request: EncodeRequest
    items: list[MediaItem]
    item_tokens: list[int]
    future: asyncio.Future[EncodedPart]
    admitted_at: float
    on_release: Callable[[], None] = lambda: None
    deadline: float = math.inf
    _released: bool = field(default=False, repr=False)

    @property
    def modality(self) -> Modality:
        """The request's modality (batches never mix modalities)."""
        return self.request.modality

    @property
    def tokens(self) -> int:
        """Output rows this request adds to a batch's budget."""
        return sum(self.item_tokens)

    @property
    def drop_reason(self) -> str:
        """Why a dead entry was abandoned: its deadline passed, or its caller went away."""
        return "timeout" if time.monotonic() >= self.deadline else "client_gone"

    @property
    def alive(self) -> bool:
        """False once answered, timed out, or abandoned by its caller."""
        return not self.future.done()

    def release(self) -> bool:
        """Leave the admission count, exactly once (taken into a batch, dropped or failed)."""
        if self._released:
            return False
        self._released = True
        self.on_release()
        return True

    def succeed(self, part: EncodedPart) -> None:
        """Deliver the result unless the caller is gone."""
        if not self.future.done():
            self.future.set_result(part)

    def fail(self, error: EncoderError) -> None:
        """Deliver an error unless the caller is gone; always leaves the admission count."""
        self.release()
        if not self.future.done():
            self.future.set_exception(error)


def as_encoder_error(exc: BaseException, stage: str) -> EncoderError:
    """Typed error for a failure of one request on its own.

    A processor that rejects a request's items on their own (ValueError) is the caller's
    problem (400); anything else is ours (500).
    """
    if isinstance(exc, EncoderError):
        return exc
    if stage == "preprocess" and isinstance(exc, ValueError):
        return InvalidRequest(f"items could not be preprocessed: {exc}")
    return InternalError(f"{stage} failed: {type(exc).__name__}: {exc}")
