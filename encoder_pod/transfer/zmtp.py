"""The ZMTP 3.0 a PUSH socket speaks (rfc.zeromq.org/spec/23, NULL mechanism), written by hand.

:class:`~encoder_pod.transfer.push_sender.PushSender` writes its own TCP connections instead of
going through libzmq so that it knows, byte for byte, what the kernel has: libzmq reports a
message as sent only when its I/O thread next runs, which on a connection whose peer stopped
reading may never come although every byte is already in the kernel. With its own bytes the
sender answers "sent" exactly when the last byte is in the kernel, and a message cut off at its
deadline is truncated on the wire, which every ZMQ receiver discards whole (a ZMQ receiver only
ever hands out complete messages). The peer is any ZMQ PULL socket (SGLang's, or
:mod:`encoder_pod.receiver`); nothing here imports pyzmq.

The whole protocol a PUSH client needs: a 64-byte greeting each way, a ``READY`` command each
way naming the socket types, then frames (a flags byte, a 1- or 8-byte length, the body). A
PULL peer sends nothing after its ``READY``; whatever it sends is read and ignored.
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

SIGNATURE_HEAD, SIGNATURE_TAIL = 0xFF, 0x7F
GREETING_SIZE = 64
MECHANISM = b"NULL"

FLAG_MORE, FLAG_LONG, FLAG_COMMAND = 0x01, 0x02, 0x04

# signature (0xFF, 8 bytes of padding, 0x7F), version 3.0, mechanism, as-server 0, filler.
GREETING = bytes([SIGNATURE_HEAD, *bytes(8), SIGNATURE_TAIL, 3, 0]) + MECHANISM.ljust(20, b"\x00") + bytes(32)


class ProtocolError(Exception):
    """The peer is not a ZMQ socket we can push to (what it sent is named)."""


def _frame_head(flags: int, size: int) -> bytes:
    if size > 255:
        return struct.pack(">BQ", flags | FLAG_LONG, size)
    return struct.pack(">BB", flags, size)


def ready_command(socket_type: bytes = b"PUSH") -> bytes:
    """The ``READY`` command frame announcing ``socket_type``."""
    name = b"Socket-Type"
    body = b"\x05READY" + bytes([len(name)]) + name + struct.pack(">I", len(socket_type)) + socket_type
    return _frame_head(FLAG_COMMAND, len(body)) + body


def as_bytes_view(frame: Any) -> memoryview:
    """A flat byte view of one frame (bytes, bytearray, a memoryview of any format)."""
    view = frame if isinstance(frame, memoryview) else memoryview(frame)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def message_segments(frames: Sequence[Any]) -> list[memoryview]:
    """The bytes of one multipart message, as views (frame bodies are not copied)."""
    views = [as_bytes_view(f) for f in frames]
    out: list[memoryview] = []
    for i, view in enumerate(views):
        out.append(memoryview(_frame_head(FLAG_MORE if i < len(views) - 1 else 0, view.nbytes)))
        if view.nbytes:
            out.append(view)
    return out


class PeerHandshake:
    """Reads the peer's greeting and ``READY``; :attr:`done` once both arrived and fit a PUSH socket."""

    def __init__(self, accepted_types: tuple[bytes, ...] = (b"PULL",)) -> None:
        self._buf = bytearray()
        self._accepted = accepted_types
        self.done = False
        self.peer_type: bytes | None = None

    def feed(self, data: bytes) -> None:
        """Take bytes the peer sent; raises :class:`ProtocolError` on anything unexpected."""
        if self.done:
            return  # a PULL peer sends nothing more; ignored
        self._buf += data
        if len(self._buf) < GREETING_SIZE:
            if self._buf[:1] and self._buf[0] != SIGNATURE_HEAD:
                raise ProtocolError(f"not a ZMTP peer (first byte {self._buf[0]:#04x})")
            return
        greeting = bytes(self._buf[:GREETING_SIZE])
        if greeting[0] != SIGNATURE_HEAD or greeting[9] != SIGNATURE_TAIL or greeting[10] < 3:
            raise ProtocolError(f"not a ZMTP 3 peer (greeting {greeting[:12]!r})")
        mechanism = greeting[12:32].rstrip(b"\x00")
        if mechanism != MECHANISM:
            raise ProtocolError(f"the peer asks for the {mechanism.decode(errors='replace')} security mechanism; only NULL is spoken")
        command = self._command(self._buf[GREETING_SIZE:])
        if command is None:
            return
        self.peer_type = _ready_socket_type(command)
        if self.peer_type not in self._accepted:
            raise ProtocolError(f"the peer is a {self.peer_type.decode(errors='replace')} socket, not PULL")
        self.done = True
        self._buf = bytearray()

    @staticmethod
    def _command(buf: bytearray) -> bytes | None:
        if len(buf) < 2:
            return None
        flags = buf[0]
        if not flags & FLAG_COMMAND:
            raise ProtocolError(f"expected the peer's READY command, got a frame with flags {flags:#04x}")
        head = 9 if flags & FLAG_LONG else 2
        if len(buf) < head:
            return None
        size = struct.unpack(">Q", buf[1:9])[0] if flags & FLAG_LONG else buf[1]
        if size > 1 << 16:
            raise ProtocolError(f"the peer's READY command claims {size} bytes")
        if len(buf) < head + size:
            return None
        return bytes(buf[head : head + size])


def _ready_socket_type(command: bytes) -> bytes:
    """The Socket-Type property of a ``READY`` command body."""
    if command[:6] != b"\x05READY":
        raise ProtocolError(f"expected READY from the peer, got {command[:16]!r}")
    at = 6
    while at < len(command):
        name_len = command[at]
        name = command[at + 1 : at + 1 + name_len]
        at += 1 + name_len
        if at + 4 > len(command):
            break
        (value_len,) = struct.unpack(">I", command[at : at + 4])
        value = command[at + 4 : at + 4 + value_len]
        at += 4 + value_len
        if name.lower() == b"socket-type":
            return value
    raise ProtocolError("the peer's READY names no Socket-Type")
