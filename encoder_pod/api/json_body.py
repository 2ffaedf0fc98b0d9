"""Request bodies as JSON without stalling the event loop, and answers sent in pieces.

Small bodies (the control endpoints, most /encode calls) are parsed with ``json.loads`` on the
loop: it takes microseconds. A large /encode body (a multi-megabyte data: URI) is parsed on an
:class:`~encoder_pod.offload.Offload` thread, and not with one ``json.loads`` call: that C call
holds the GIL for its whole run (about 2 ms per MiB here), so a thread alone would still stall
the loop. :func:`parse_large` uses the standard library's pure-Python scanner, whose long strings
are cut out slice by slice (the only long values a body has are its items), so the GIL returns
to the loop between slices. The result is the value ``json.loads`` returns for the same bytes.

Both refuse JSON nested deeper than :data:`encoder_pod.json_limits.MAX_DEPTH` (``JsonTooDeep``):
a small body that could nest deeper (more brackets than that) goes to :func:`parse_large` too,
whose decoder counts depth.
"""

from __future__ import annotations

import json
import json.decoder
from typing import Any, Callable, Iterator, Sequence

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from encoder_pod.json_limits import BoundedDecoder, decode_text

SMALL_BODY = 256 * 1024
"""Bodies up to this size are parsed on the loop with ``json.loads``."""

SCAN_SLICE = 1 << 20
"""Characters of one string examined per step while parsing a large body."""

# In the standard library but not in its type stubs.
_scanstring: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


def _scan_string(s: str, end: int, strict: bool = True) -> tuple[str, int]:
    """``json.decoder.scanstring`` with a sliced fast path for plain strings.

    A string with no escape, no control and only ASCII characters (base64, URLs) is cut out
    after checking it one slice at a time; anything else goes to the standard scanner, which
    also raises the standard errors.
    """
    at, size = end, len(s)
    while True:
        stop = min(at + SCAN_SLICE, size)
        quote = s.find('"', at, stop)
        piece = s[at : stop if quote == -1 else quote]
        if "\\" in piece or not (piece.isascii() and piece.isprintable()):
            return _scanstring(s, end, strict)
        if quote != -1:
            return s[end:quote], quote + 1
        if stop == size:
            return _scanstring(s, end, strict)  # unterminated: the standard error
        at = stop


class _SlicedDecoder(BoundedDecoder):
    def __init__(self) -> None:
        super().__init__(parse_string=_scan_string)


def parse_large(chunks: Sequence[bytes]) -> Any:
    """The JSON value of a large body given as its received chunks (CPU work: call on a thread).

    Raises ``json.JSONDecodeError`` or ``UnicodeDecodeError`` as ``json.loads`` would, and
    ``JsonTooDeep`` for nesting beyond the limit.
    """
    return _SlicedDecoder().decode(decode_text(b"".join(chunks)))


class PiecesResponse(Response):
    """A response (JSON unless ``media_type`` says otherwise) whose body is sent piece by piece
    (the HTTP server's flow control in between)."""

    media_type = "application/json"

    def __init__(
        self,
        pieces: Sequence[bytes | bytearray | memoryview],
        status_code: int = 200,
        media_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._pieces = pieces
        size = sum(memoryview(p).nbytes for p in pieces)
        headers = {**(headers or {}), "content-length": str(size)}
        super().__init__(content=None, status_code=status_code, headers=headers, media_type=media_type)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        last = b""
        for n, chunk in enumerate(coalesce(self._pieces, SEND_CHUNK)):
            if n:  # one chunk behind: the last one ends the body in the same message
                await send({"type": "http.response.body", "body": last, "more_body": True})
            last = chunk
        await send({"type": "http.response.body", "body": last, "more_body": False})


SEND_CHUNK = 1 << 20
"""Bytes per body message: fewer messages (each one crosses every ASGI layer), flow control between."""


def coalesce(pieces: Sequence[bytes | bytearray | memoryview], size: int) -> Iterator[bytes]:
    """The pieces' bytes regrouped into chunks of about ``size`` (each copied once, as sending needs)."""
    group: list[bytes | bytearray | memoryview] = []
    held = 0
    for piece in pieces:
        group.append(piece)
        held += memoryview(piece).nbytes
        if held >= size:
            yield b"".join(group)
            group, held = [], 0
    if group:
        yield b"".join(group)
