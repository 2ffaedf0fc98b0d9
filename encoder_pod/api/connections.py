"""The HTTP server's own connection limits: header-read time, concurrent connections, keep-alive.

uvicorn's h11 protocol starts no timer before its first answer, so a connection that never
completes its headers stays open forever (one file descriptor each), and it bounds tasks, not
connections. :class:`LimitedH11Protocol` adds, per connection:

- ``HTTP_HEADER_TIMEOUT``: from the moment a connection opens, and again from the end of each
  answer, the next request's headers must be complete within this many seconds (a slow drip of
  bytes does not restart the clock), or the connection is closed without an answer (there is no
  request to answer). Headers are bounded in size by h11 (16 KiB, else 400).
- ``HTTP_MAX_CONNECTIONS``: a connection beyond this many open ones is answered at once with a
  503 (``Retry-After: 1``, ``Connection: close``), its write side is shut, and it is closed once
  the client closes or after :data:`REFUSAL_LINGER_S`; what the client sends meanwhile is read
  and dropped, so the close never resets it before it read the answer.
- ``HTTP_KEEPALIVE_TIMEOUT`` is uvicorn's own idle keep-alive timeout (set on its config).

A request body that arrives slowly is bounded by the request, not here.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from encoder_pod.settings import ServerSettings

REFUSAL_LINGER_S = 1.0
"""How long a refused connection stays open for its client to read the 503."""


@dataclass(frozen=True)
class HttpLimits:
    """The limits one server applies to every connection."""

    header_timeout: float
    max_connections: int

    @classmethod
    def of(cls, server: ServerSettings) -> HttpLimits:
        """The limits the settings ask for."""
        return cls(server.http_header_timeout, server.http_max_connections)

    def refusal(self) -> bytes:
        """The whole HTTP answer to a connection beyond ``max_connections``."""
        body = json.dumps(
            {
                "status": "error",
                "message": f"too many open connections ({self.max_connections}, ENCODER_HTTP_MAX_CONNECTIONS); retry later",
                "req_id": None,
            }
        ).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
            f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body


def limited_protocol(limits: HttpLimits) -> type[H11Protocol]:
    """The protocol class uvicorn builds per connection (``uvicorn.Config(http=...)``), bound to ``limits``."""

    class EncoderHttpProtocol(LimitedH11Protocol):
        LIMITS = limits

    return EncoderHttpProtocol


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline and a bound on open connections."""

    LIMITS: ClassVar[HttpLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._refused: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Refuse a connection over the limit; otherwise start its header clock."""
        if len(self.connections) >= self.LIMITS.max_connections:
            self.transport = transport
            transport.write(self.LIMITS.refusal())
            if transport.can_write_eof():
                transport.write_eof()
            self._refused = self.loop.call_later(REFUSAL_LINGER_S, transport.close)
            return
        super().connection_made(transport)
        self._watch_headers()

    def data_received(self, data: bytes) -> None:
        """Parse as uvicorn does (a refused connection's bytes are dropped), then follow the header clock."""
        if self._refused is not None:
            return
        super().data_received(data)
        self._watch_headers()

    def on_response_complete(self) -> None:
        """After an answer the next request's headers get a fresh clock (unless they are already in)."""
        super().on_response_complete()
        self._watch_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the clocks; a refused connection was never one of uvicorn's."""
        self._stop_header_clock()
        if self._refused is not None:
            self._refused.cancel()
            self.transport.close()
            return
        super().connection_lost(exc)

    def _watch_headers(self) -> None:
        """The clock runs while the client owes a request's headers (h11: IDLE), and only then."""
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            self._stop_header_clock()
        elif self._header_deadline is None:
            self._header_deadline = self.loop.call_later(self.LIMITS.header_timeout, self._headers_too_slow)

    def _stop_header_clock(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()
