"""The operator's one exception tree.

The client module translates the Kubernetes client's exceptions into these types, so nothing
above it needs to know which client library talks to the API server. The handler module maps
them to kopf's retry semantics in one place: invalid input is permanent, everything that may
heal by itself (a conflict, a timeout, an unavailable API server) is temporary.
"""

from __future__ import annotations


class OperatorError(Exception):
    """Base of every error the operator raises on purpose."""

    #: Whether retrying the same input later can succeed.
    retryable: bool = True


class InvalidSpecError(OperatorError):
    """The pool's spec cannot be turned into children (surfaced as reason InvalidSpec)."""

    retryable = False


class ApiError(OperatorError):
    """A request to the API server failed; ``status`` is the HTTP code (0 = no response)."""

    def __init__(self, message: str, *, status: int = 0, verb: str = "", resource: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.verb = verb
        self.resource = resource


class NotFoundError(ApiError):
    """The object does not exist (404)."""


class ConflictError(ApiError):
    """A write lost a race or an ownership conflict (409); retry with fresh state."""


class ForbiddenError(ApiError):
    """RBAC refused the request (403): the chart's ClusterRole misses a verb."""


class RejectedError(ApiError):
    """The API server refused an object as invalid (400/422): the spec produced a bad child."""

    retryable = False


class UnavailableError(ApiError):
    """No usable answer: connection refused, timeout, 429 or 5xx."""
