"""The gRPC face's one error table: each :class:`~encoder_pod.errors.ErrorKind` to a status code.

The HTTP edge maps the same kinds to HTTP statuses (:data:`encoder_pod.errors.HTTP_STATUS`); this
is its gRPC twin, so a gateway can act on the code alone:

- the caller's mistake (a field, an item) is ``INVALID_ARGUMENT``, its details naming the field;
- a req_id already in flight is ``ALREADY_EXISTS``; something the pod does not have, ``NOT_FOUND``;
- a full queue (or a request above a size limit) is ``RESOURCE_EXHAUSTED``: back off;
- loading, draining, stopping or no live worker is ``UNAVAILABLE``: retry on another encoder
  (a drain adds ``grpc-retry-pushback-ms``, gRPC's own retry hint, as HTTP adds ``Retry-After``);
- the request outliving ``ENCODER_REQ_TIMEOUT`` is ``DEADLINE_EXCEEDED``;
- a push to the prefill side that failed is ``UNAVAILABLE`` (HTTP's 502: the receiver, not the
  request, is the problem);
- anything else is ``INTERNAL``.

Every failed call also carries the kind itself as trailing metadata (``encoderpool-error-kind``).
"""

from __future__ import annotations

import logging

import grpc

from encoder_pod.errors import EncoderError, ErrorKind

log = logging.getLogger(__name__)

GRPC_STATUS: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.INVALID_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.DUPLICATE_REQUEST: grpc.StatusCode.ALREADY_EXISTS,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.PAYLOAD_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.NOT_READY: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.SHUTTING_DOWN: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.DRAINING: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.WORKER_DIED: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorKind.TRANSFER_FAILED: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.INTERNAL: grpc.StatusCode.INTERNAL,
}

KIND_KEY = "encoderpool-error-kind"
"""Trailing metadata key: the error's kind (``invalid_request``, ``overloaded``, ...)."""
REQ_ID_KEY = "encoderpool-req-id"
"""Trailing metadata key: the req_id the error is about, when it names one."""
PUSHBACK_KEY = "grpc-retry-pushback-ms"
"""gRPC's retry pushback: milliseconds a retrying client waits (set where HTTP sends Retry-After)."""


class Refusal:
    """What a failed call answers: a status code, its details and trailing metadata."""

    def __init__(self, code: grpc.StatusCode, details: str, metadata: tuple[tuple[str, str], ...]) -> None:
        self.code = code
        self.details = details
        self.metadata = metadata


def refusal(exc: BaseException) -> Refusal:
    """The answer to ``exc``: its kind's code for an :class:`EncoderError`, else INTERNAL (logged once)."""
    if isinstance(exc, EncoderError):
        metadata = [(KIND_KEY, exc.kind.value)]
        if exc.req_id and exc.req_id.isascii() and exc.req_id.isprintable():  # metadata values are printable ASCII
            metadata.append((REQ_ID_KEY, exc.req_id))
        if exc.retry_after is not None:
            metadata.append((PUSHBACK_KEY, str(exc.retry_after * 1000)))
        return Refusal(GRPC_STATUS[exc.kind], exc.message, tuple(metadata))
    log.error("internal error on a gRPC call", exc_info=exc)
    details = f"internal error: {type(exc).__name__}: {exc}"
    return Refusal(grpc.StatusCode.INTERNAL, details, ((KIND_KEY, ErrorKind.INTERNAL.value),))
