"""The encoder pod's one exception tree.

Each error carries an :class:`ErrorKind`; the kind maps to an HTTP status in ONE table
(:data:`HTTP_STATUS`), used by the HTTP edge and by the typed messages that cross process
boundaries (data-parallel workers, tensor-parallel ranks, the wire to prefill servers).

Only what the caller sent can be a 4xx. An item's bytes that cannot be used (not decodable, the
wrong format, too large, too long) are a :class:`MediaError`, raised by the media decoders and
by an adapter's ``measure``; the runtime names the item (:class:`ItemError`, 400). Any other
exception is a fault of the server: it is logged once with its traceback and answered as an
:class:`InternalError` (500).
"""

from __future__ import annotations

from enum import Enum


class ErrorKind(str, Enum):
    """What went wrong, independent of the transport that reports it."""

    INVALID_REQUEST = "invalid_request"
    NOT_FOUND = "not_found"
    DUPLICATE_REQUEST = "duplicate_request"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    OVERLOADED = "overloaded"
    NOT_READY = "not_ready"
    SHUTTING_DOWN = "shutting_down"
    DRAINING = "draining"
    WORKER_DIED = "worker_died"
    TIMEOUT = "timeout"
    TRANSFER_FAILED = "transfer_failed"
    INTERNAL = "internal"


HTTP_STATUS: dict[ErrorKind, int] = {
    ErrorKind.INVALID_REQUEST: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.DUPLICATE_REQUEST: 409,
    ErrorKind.PAYLOAD_TOO_LARGE: 413,
    ErrorKind.OVERLOADED: 429,
    ErrorKind.NOT_READY: 503,
    ErrorKind.SHUTTING_DOWN: 503,
    ErrorKind.DRAINING: 503,
    ErrorKind.WORKER_DIED: 503,
    ErrorKind.TIMEOUT: 504,
    ErrorKind.TRANSFER_FAILED: 502,
    ErrorKind.INTERNAL: 500,
}

DRAINING_MESSAGE = "draining: this encoder is shutting down and takes no new requests; retry on another"
"""The message of every refusal while a pod drains (new /encode, /health)."""

RETRY_AFTER_S: dict[ErrorKind, int] = {
    ErrorKind.DRAINING: 1,
}
"""Kinds whose answer carries ``Retry-After`` (seconds): retrying elsewhere at once is right."""


class EncoderError(Exception):
    """Base of every error the encoder pod reports to a caller."""

    kind: ErrorKind = ErrorKind.INTERNAL

    def __init__(self, message: str, *, req_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.req_id = req_id

    @property
    def http_status(self) -> int:
        """The HTTP status code of this error's kind."""
        return HTTP_STATUS[self.kind]

    @property
    def retry_after(self) -> int | None:
        """Seconds for a ``Retry-After`` header, or None when the answer carries none."""
        return RETRY_AFTER_S.get(self.kind)

    @classmethod
    def from_kind(cls, kind: ErrorKind, message: str, req_id: str | None = None) -> "EncoderError":
        """Rebuild a typed error from a message that crossed a process boundary."""
        err = _BY_KIND.get(kind, InternalError)(message, req_id=req_id)
        err.kind = kind
        return err


class InvalidRequest(EncoderError):
    """The request body or one of its fields is malformed (400)."""

    kind = ErrorKind.INVALID_REQUEST


class MediaError(InvalidRequest, ValueError):
    """One media item's bytes or decoded content cannot be used (400): bad bytes, format, size, duration.

    Raised where the item's index is unknown (decoders, sources, ``measure``); the runtime turns
    it into an :class:`ItemError` naming the item. Also a ``ValueError``: it is a bad value.
    """


class ItemError(MediaError):
    """One media item cannot be used; the message names its index, ``mm_items[i]`` (400)."""

    def __init__(self, index: int, reason: str, *, req_id: str | None = None) -> None:
        super().__init__(f"mm_items[{index}]: {reason}", req_id=req_id)
        self.index = index
        self.reason = reason


class FaceOff(EncoderError):
    """A route of a face this pod does not serve (vLLM's without its storage path), or a stored item it lacks (404)."""

    kind = ErrorKind.NOT_FOUND


class DuplicateRequest(EncoderError):
    """A request with the same req_id is already in flight (409)."""

    kind = ErrorKind.DUPLICATE_REQUEST


class PayloadTooLarge(EncoderError):
    """The body exceeds MAX_REQUEST_BYTES (413)."""

    kind = ErrorKind.PAYLOAD_TOO_LARGE


class Overloaded(EncoderError):
    """The admission queue is full (429)."""

    kind = ErrorKind.OVERLOADED


class NotReady(EncoderError):
    """The model is not loaded, or the health encode failed (503)."""

    kind = ErrorKind.NOT_READY


class ShuttingDown(EncoderError):
    """The server is stopping and will not start this request (503)."""

    kind = ErrorKind.SHUTTING_DOWN


class Draining(ShuttingDown):
    """The pod is draining (SIGTERM): it finishes what it holds and takes nothing new (503 + Retry-After)."""

    kind = ErrorKind.DRAINING


class WorkerDied(EncoderError):
    """The worker process that held this request died (503)."""

    kind = ErrorKind.WORKER_DIED


class RequestTimeout(EncoderError):
    """The request outlived REQ_TIMEOUT (504)."""

    kind = ErrorKind.TIMEOUT


class TransferFailed(EncoderError):
    """The embedding could not be pushed to its prefill server (502)."""

    kind = ErrorKind.TRANSFER_FAILED


class InternalError(EncoderError):
    """A real fault inside the server (500)."""

    kind = ErrorKind.INTERNAL


class SliceMismatch(InternalError):
    """The model produced a different number of rows than preprocessing promised (500).

    Handing out slices anyway would shift every later request's embedding, so the batch fails.
    """

    def __init__(self, expected: int, produced: int) -> None:
        super().__init__(
            f"encoder output has {produced} rows but preprocessing promised {expected}; "
            "refusing to slice a batch that does not add up"
        )
        self.expected = expected
        self.produced = produced


_BY_KIND: dict[ErrorKind, type[EncoderError]] = {
    ErrorKind.INVALID_REQUEST: InvalidRequest,
    ErrorKind.NOT_FOUND: FaceOff,
    ErrorKind.DUPLICATE_REQUEST: DuplicateRequest,
    ErrorKind.PAYLOAD_TOO_LARGE: PayloadTooLarge,
    ErrorKind.OVERLOADED: Overloaded,
    ErrorKind.NOT_READY: NotReady,
    ErrorKind.SHUTTING_DOWN: ShuttingDown,
    ErrorKind.DRAINING: Draining,
    ErrorKind.WORKER_DIED: WorkerDied,
    ErrorKind.TIMEOUT: RequestTimeout,
    ErrorKind.TRANSFER_FAILED: TransferFailed,
    ErrorKind.INTERNAL: InternalError,
}


class ModelLoadFailed(Exception):
    """The model did not load, so this pod can serve nothing: the server stops and the process
    exits ``MODEL_LOAD_FAILED`` with ``encoder-pod: model load failed: <message>`` as its last line.

    No caller is answered with it (it is no :class:`EncoderError`): it goes from the runtime or
    the data-parallel front to the server, which stops, and from there to the CLI.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
