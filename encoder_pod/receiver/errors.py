"""The receiver library's one exception tree.

A prefill server catches :class:`ReceiverError` (or one of its kinds) around ``wait``. Frame
problems are typed, never a crash of the receive loop; an error the encoder reported keeps the
encoder pod's :class:`~encoder_pod.errors.ErrorKind` and HTTP status, so nothing is re-typed by
comparing strings.
"""

from __future__ import annotations

from encoder_pod.errors import HTTP_STATUS, ErrorKind


class ReceiverError(Exception):
    """Base of every error the receiver library raises."""

    def __init__(self, message: str, *, req_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.req_id = req_id


class MalformedMessage(ReceiverError):
    """A message that is not a valid frame set of the wire format (garbage, truncated, bad field)."""


class UnsupportedVersion(MalformedMessage):
    """The header names a wire-format version this library does not read."""

    def __init__(self, version: object, supported: int, *, req_id: str | None = None) -> None:
        super().__init__(f"wire format version {version!r} is not supported (this receiver reads {supported})", req_id=req_id)
        self.version = version


class PayloadMismatch(MalformedMessage):
    """The payload's byte count does not match the header's dtype and shape."""


class InconsistentParts(ReceiverError):
    """Parts of one request disagree (num_parts, dtype or width), or a part came twice."""


class RemoteEncodeError(ReceiverError):
    """The encoder failed this request and said so on the wire (an error part)."""

    def __init__(self, message: str, *, req_id: str, kind: ErrorKind, status: int, part_idx: int) -> None:
        super().__init__(message, req_id=req_id)
        self.kind = kind
        self.status = status
        self.part_idx = part_idx

    @classmethod
    def from_kind(cls, message: str, *, req_id: str, kind: ErrorKind, part_idx: int) -> "RemoteEncodeError":
        """An error of ``kind`` with the encoder pod's HTTP status for that kind."""
        return cls(message, req_id=req_id, kind=kind, status=HTTP_STATUS[kind], part_idx=part_idx)


class RequestExpired(ReceiverError):
    """Not every part of a request arrived before the receiver's expiry."""

    def __init__(self, req_id: str, received: int, num_parts: int, after_s: float) -> None:
        super().__init__(
            f"request {req_id!r} expired after {after_s:g}s with {received} of {num_parts} parts", req_id=req_id
        )
        self.received = received
        self.num_parts = num_parts


class WaitTimeout(ReceiverError, TimeoutError):
    """``wait`` ran out of time; the request may still complete later."""


class ReceiverClosed(ReceiverError):
    """The receiver was closed while a caller waited."""


class DispatchError(ReceiverError):
    """The client helper could not get a part encoded: an encoder answered an error or was unreachable."""

    def __init__(self, message: str, *, req_id: str, status: int, encoder_url: str) -> None:
        super().__init__(message, req_id=req_id)
        self.status = status
        self.encoder_url = encoder_url
