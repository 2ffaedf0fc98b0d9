"""The HTTP server's own connection limits: header-read time, header size, concurrent connections.

uvicorn's protocols start no timer before their first answer, so a connection that never
completes its headers stays open forever (one file descriptor each), and they bound tasks, not
connections. :func:`limited_protocol` builds the protocol uvicorn runs per connection: its
httptools protocol (C parser; the default) or its h11 one (``HTTP_PARSER=h11``), plus, per
connection:

- ``HTTP_HEADER_TIMEOUT``: from the moment a connection opens, and again from the end of each
  answer, the next request's headers must be complete within this many seconds (a slow drip of
  bytes does not restart the clock), or the connection is closed without an answer (there is no
  request to answer).
- Header size: at most :data:`MAX_HEADER_BYTES` of a request's head (h11 enforces the same bound
  itself, with a 400); beyond, a 431 and the connection is closed.
- A request that cannot be parsed, or a head over the bound, is answered (400 or 431, the
  error body of docs/api.md), the write side is shut, and what the client still sends is read and
  dropped until it closes or :data:`REFUSAL_LINGER_S` passes. Closing at once would turn the
  unread input into a TCP reset, which can destroy the answer before the client reads it.
- ``HTTP_MAX_CONNECTIONS``: a connection beyond this many open ones is answered at once with a
  503 (``Retry-After: 1``, ``Connection: close``), its write side is shut, and it is closed once
  the client closes or after :data:`REFUSAL_LINGER_S`; what the client sends meanwhile is read
  and dropped, so the close never resets it before it read the answer.
- ``HTTP_KEEPALIVE_TIMEOUT`` is uvicorn's own idle keep-alive timeout (set on its config).
- For the drain (``encoder_pod.drain``): :meth:`_ConnectionLimits.quiet_for` says how long a
  connection has had no request in progress and received nothing, so that the drain closes only
  connections no request is on its way on.

A request body that arrives slowly is bounded by the request, not here.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from encoder_pod.settings import ServerSettings

try:  # a dependency; the h11 protocol stays usable without it
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools missing
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

MAX_HEADER_BYTES = 16 * 1024
"""Largest request head (request line and headers) a connection may send: h11's own bound."""

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
        return raw_answer(
            "503 Service Unavailable",
            f"too many open connections ({self.max_connections}, ENCODER_HTTP_MAX_CONNECTIONS); retry later",
            "retry-after: 1\r\n",
        )


def raw_answer(status: str, message: str, extra_headers: str = "") -> bytes:
    """A whole HTTP answer with the error body of docs/api.md, written by the connection itself (no request to answer)."""
    body = json.dumps({"status": "error", "message": message, "req_id": None}).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{extra_headers}"
        f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def limited_protocol(limits: HttpLimits, parser: Literal["httptools", "h11"] = "httptools") -> type[asyncio.Protocol]:
    """The protocol class uvicorn builds per connection (``uvicorn.Config(http=...)``), bound to ``limits``.

    ``httptools`` falls back to ``h11`` when the httptools package is missing."""
    base: type[asyncio.Protocol] = (
        LimitedHttpToolsProtocol if parser == "httptools" and HttpToolsProtocol is not None else LimitedH11Protocol
    )
    return type("EncoderHttpProtocol", (base,), {"LIMITS": limits})


class _ConnectionLimits:
    """The limits of the module docstring, over one of uvicorn's HTTP protocols (a mixin: it comes first).

    The protocol below says when the client owes a request's head (:meth:`_owes_headers`)."""

    LIMITS: ClassVar[HttpLimits]
    connections: set[Any]
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._refused: asyncio.TimerHandle | None = None
        self._lingering: asyncio.TimerHandle | None = None
        """Set once a request was refused: the answer is out, the input is dropped until the close."""
        self._active_at = time.monotonic()
        """When the connection last received bytes or finished an answer (or opened)."""

    def _owes_headers(self) -> bool:
        raise NotImplementedError

    def quiet_for(self) -> float:
        """Seconds without a request in progress and without a byte received (0 while a request runs)."""
        if not self._owes_headers():
            return 0.0
        return time.monotonic() - self._active_at

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Refuse a connection over the limit; otherwise start its header clock."""
        if len(self.connections) >= self.LIMITS.max_connections:
            self.transport = cast(asyncio.Transport, transport)
            self._refused = self._answer_and_linger(self.LIMITS.refusal())
            return
        super().connection_made(transport)  # type: ignore[misc]
        self._watch_headers()

    def data_received(self, data: bytes) -> None:
        """Parse as uvicorn does (a refused connection's bytes are dropped), then follow the header clock."""
        if self._refused is not None or self._lingering is not None:
            return
        self._active_at = time.monotonic()
        super().data_received(data)  # type: ignore[misc]
        self._watch_headers()

    def on_response_complete(self) -> None:
        """After an answer the next request's headers get a fresh clock (unless they are already in)."""
        super().on_response_complete()  # type: ignore[misc]
        self._active_at = time.monotonic()
        self._watch_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the clocks; a refused connection was never one of uvicorn's."""
        self._stop_header_clock()
        if self._refused is not None:
            self._refused.cancel()
            self.transport.close()
            return
        if self._lingering is not None:
            self._lingering.cancel()
        super().connection_lost(exc)  # type: ignore[misc]

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request it cannot parse (both parsers call it), with a lingering close."""
        self._refuse_request(raw_answer("400 Bad Request", msg))

    def _refuse_request(self, answer: bytes) -> None:
        """Answer, shut the write side, and close once the client does or after :data:`REFUSAL_LINGER_S`."""
        self._stop_header_clock()
        if self.transport.is_closing() or self._lingering is not None:
            return
        self._lingering = self._answer_and_linger(answer)

    def _answer_and_linger(self, answer: bytes) -> asyncio.TimerHandle:
        """Write ``answer``, shut the write side, and close after :data:`REFUSAL_LINGER_S` (the handle)."""
        self.transport.write(answer)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        return self.loop.call_later(REFUSAL_LINGER_S, self.transport.close)

    def _watch_headers(self) -> None:
        """The clock runs while the client owes a request's headers, and only then."""
        if not self._owes_headers() or self.transport.is_closing():
            self._stop_header_clock()
        elif self._header_deadline is None:
            self._header_deadline = self.loop.call_later(self.LIMITS.header_timeout, self._headers_too_slow)

    def _stop_header_clock(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self._owes_headers() and not self.transport.is_closing():
            self.transport.close()


class LimitedH11Protocol(_ConnectionLimits, H11Protocol):
    """uvicorn's h11 protocol with the limits (h11 bounds the head's size itself)."""

    def _owes_headers(self) -> bool:
        return self.conn.their_state is h11.IDLE


if HttpToolsProtocol is not None:

    class LimitedHttpToolsProtocol(_ConnectionLimits, HttpToolsProtocol):
        """uvicorn's httptools protocol with the limits; the head's size is bounded here."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._awaiting_head = True
            """True from a connection's start, and from the end of each request, until a request's head is in."""
            self._head_bytes = 0
            self._ended_in_chunk = False
            """A request ended inside the chunk being parsed: its bytes are not all the next head's."""

        def _owes_headers(self) -> bool:
            return self._awaiting_head and (self.cycle is None or self.cycle.response_complete)

        def data_received(self, data: bytes) -> None:
            """Parse; while a head stays incomplete, count its bytes against :data:`MAX_HEADER_BYTES`."""
            if self._refused is not None or self._lingering is not None:
                return
            self._ended_in_chunk = False
            super().data_received(data)
            if not self._awaiting_head or self._ended_in_chunk or self.transport.is_closing():
                self._head_bytes = 0  # counting starts again with the next chunk
                return
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEADER_BYTES:
                self._refuse_head()

        def on_headers_complete(self) -> None:
            self._awaiting_head = False
            self._head_bytes = 0
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._awaiting_head = True
            self._ended_in_chunk = True

        def _refuse_head(self) -> None:
            self._refuse_request(raw_answer(
                "431 Request Header Fields Too Large", f"request head is over {MAX_HEADER_BYTES} bytes (request line and headers)"
            ))
