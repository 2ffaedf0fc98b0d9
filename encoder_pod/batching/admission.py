"""Admission: the one bound on requests a pod holds, the same in every mode.

``ENCODER_MAX_QUEUE`` counts requests **admitted and not yet answered**: from the moment a
request passes validation until its answer (embedding, ``200 null`` after a push, or an error)
is handed back to the HTTP edge. That covers waiting for a batch, decoding, the forward and the
delivery. The single-process runtime and the data-parallel front each own one
:class:`Admission` (with ``--dp-size`` the front's counts every rank's requests, including those
waiting for a worker slot), so 429 comes at the same point whatever the mode.

A request holds a :class:`Permit` for that whole time (text-embeddings-inference's owned
semaphore permit): taken at once or refused (409 for a req_id already in flight, 429 when full,
503 once admission is closed), released exactly once by ``async with`` however the request
ends (answer, error, timeout, cancellation when the client is gone).

Single-threaded by design: every method runs on the owner's event loop, so no locks. Imports
nothing heavy: the data-parallel front uses it without torch.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Callable, Protocol

from encoder_pod.errors import DuplicateRequest, EncoderError, Overloaded, ShuttingDown


class _Gauge(Protocol):
    def set(self, value: float) -> None:
        """Set the gauge."""


class Permit:
    """One admitted request's place; released exactly once (``async with`` or :meth:`release`)."""

    def __init__(self, admission: Admission, req_id: str) -> None:
        self._admission = admission
        self.req_id = req_id
        self._held = True

    @property
    def held(self) -> bool:
        """True until released."""
        return self._held

    def release(self) -> bool:
        """Give the place back; False (and nothing happens) if it was already released."""
        if not self._held:
            return False
        self._held = False
        self._admission._release(self)
        return True

    async def __aenter__(self) -> Permit:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class Admission:
    """At most ``limit`` requests admitted and not yet answered; one in flight per req_id."""

    def __init__(self, limit: int, gauge: _Gauge | None = None) -> None:
        self.limit = limit
        self._gauge = gauge
        self._permits: dict[str, Permit] = {}
        self._closed: Callable[[], EncoderError] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        """Permits held right now."""
        return len(self._permits)

    def admit(self, req_id: str) -> Permit:
        """A permit for ``req_id`` now, or the typed refusal (503 closed, 409 duplicate, 429 full)."""
        if self._closed is not None:
            raise self._closed()
        if req_id in self._permits:
            raise DuplicateRequest(f"req_id {req_id!r} is already in flight", req_id=req_id)
        if len(self._permits) >= self.limit:
            raise Overloaded(
                f"queue is full ({self.limit} requests in flight, ENCODER_MAX_QUEUE); retry later", req_id=req_id
            )
        permit = Permit(self, req_id)
        self._permits[req_id] = permit
        self._idle.clear()
        self._changed()
        return permit

    def close(self, make_error: Callable[[], EncoderError] | None = None) -> None:
        """Refuse every later :meth:`admit` with ``make_error()`` (default: 503 shutting down).

        Permits already held stay valid: their requests finish and release them.
        """
        self._closed = make_error or (lambda: ShuttingDown("server is shutting down"))

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no permit is held (or ``timeout`` passed); True when idle."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def _release(self, permit: Permit) -> None:
        if self._permits.get(permit.req_id) is permit:
            del self._permits[permit.req_id]
        if not self._permits:
            self._idle.set()
        self._changed()

    def _changed(self) -> None:
        if self._gauge is not None:
            self._gauge.set(len(self._permits))
