"""A request waiting for its share of a batch, and how failures become typed errors."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Callable

from encoder_pod.errors import EncoderError, InternalError, InvalidRequest
from encoder_pod.modality import Modality
from encoder_pod.models.base import EncodedPart, MediaItem
from encoder_pod.protocol import EncodeRequest

log = logging.getLogger(__name__)

PROCESSOR_PACKAGES = ("transformers",)
"""Where the Hugging Face processors live: a ValueError raised in there is a refusal of the input."""


@dataclass(eq=False)
class PendingEntry:
    """One admitted request; its future resolves to its :class:`EncodedPart`.

    Its items are decoded before it is submitted, or, submitted to an idle model, by the model
    thread itself just before its preprocessing (``decode``; see :meth:`BatchScheduler.idle`).
    Its place in admission is the request's :class:`~encoder_pod.batching.admission.Permit`,
    held by whoever awaits the future; the entry itself holds nothing to release.
    """

    request: EncodeRequest
    items: list[MediaItem]
    item_tokens: list[int]
    future: asyncio.Future[EncodedPart]
    admitted_at: float
    deadline: float = math.inf
    decode: Callable[[], list[tuple[MediaItem, int]]] | None = None
    """Set while the items are still to be decoded: returns (item, output rows) per item."""

    @property
    def decoded(self) -> bool:
        """False until the items exist (an entry that is not runs alone, see :attr:`decode`)."""
        return self.decode is None

    def decode_now(self) -> None:
        """Decode the items if they are still to be (on the thread that preprocesses them next)."""
        if self.decode is not None:
            loaded, self.decode = self.decode(), None
            self.items = [item for item, _ in loaded]
            self.item_tokens = [tokens for _, tokens in loaded]

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

    def succeed(self, part: EncodedPart) -> None:
        """Deliver the result unless the caller is gone."""
        if not self.future.done():
            self.future.set_result(part)

    def fail(self, error: EncoderError) -> None:
        """Deliver an error unless the caller is gone."""
        if not self.future.done():
            self.future.set_exception(error)


def raised_by_processor(exc: BaseException) -> bool:
    """True when ``exc`` was raised while a Hugging Face processor ran (a frame of its traceback is in it)."""
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        if module.split(".", 1)[0] in PROCESSOR_PACKAGES:
            return True
        tb = tb.tb_next
    return False


def as_encoder_error(exc: BaseException, stage: str) -> EncoderError:
    """Typed error for a failure of one request on its own.

    Only the caller's input is a 400: a :class:`~encoder_pod.errors.MediaError` (an
    :class:`EncoderError`, kept as it is), or a ValueError the Hugging Face processor raised
    while preprocessing (it refused the request's media). Any other exception, a ValueError of
    our own code included, is a fault of the server: logged with its traceback, answered 500.
    """
    if isinstance(exc, EncoderError):
        return exc
    if stage == "preprocess" and isinstance(exc, ValueError) and raised_by_processor(exc):
        return InvalidRequest(f"items could not be preprocessed: {exc}")
    log.error("%s of a request failed inside the server", stage, exc_info=exc)
    return InternalError(f"{stage} failed: {type(exc).__name__}: {exc}")
