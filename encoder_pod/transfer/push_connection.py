"""One push command and one ZMTP connection of :class:`~encoder_pod.transfer.push_sender.PushSender`.

Everything here runs on the sender thread, except :func:`resolve` (the caller's event loop) and
:meth:`PushCommand.settle`'s callback. A connection writes its handshake, then its queued
messages in order, and counts every byte the kernel took: a message is sent when its last byte
is in the kernel, and is *started* from its first; a started message can only finish or be cut
off with the connection (which its receiver then drops whole).
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import selectors
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from encoder_pod.errors import TransferFailed
from encoder_pod.transfer.zmtp import GREETING, PeerHandshake, ready_command

_MAX_SEGMENTS = 64


class Broken(Exception):
    """The connection failed (its reason is the message); queued messages wait for the next one."""


def host_port(endpoint: str) -> str:
    """``tcp://host:port`` -> ``host:port`` (what error messages name)."""
    return endpoint.removeprefix("tcp://")


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``tcp://host:port`` or ``tcp://[v6]:port`` -> (host, port); TransferFailed names a bad one."""
    host, sep, port = host_port(endpoint).rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not endpoint.startswith("tcp://") or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise TransferFailed(f"{endpoint!r} is not a tcp://host:port endpoint")
    return host, int(port)


async def resolve(endpoint: str) -> tuple[int, tuple[Any, ...]]:
    """(address family, socket address) of an endpoint; a host name is looked up off the loop."""
    host, port = parse_endpoint(endpoint)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return (socket.AF_INET6, (host, port, 0, 0)) if ip.version == 6 else (socket.AF_INET, (host, port))
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise TransferFailed(f"{host_port(endpoint)}: cannot resolve {host!r} ({exc})") from None
    if not infos:
        raise TransferFailed(f"{host_port(endpoint)}: {host!r} resolves to no address")
    family, _, _, _, address = infos[0]
    return family, address


@dataclass
class PushCommand:
    """One message to push, and the caller's future."""

    endpoint: str
    family: int
    address: tuple[Any, ...]
    segments: list[memoryview]
    deadline: float
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]
    timeout: float
    at: int = 0
    """Index of the first segment not wholly written."""
    started: bool = False
    """Some byte of it is in the kernel: from now on it is either sent or cut off."""

    def settle(self, error: BaseException | None = None) -> None:
        """Resolve the caller's future from the sender thread (no-op if the caller gave up)."""
        self.segments = []  # release the tensor memory now

        def apply() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(None)

        try:
            self.loop.call_soon_threadsafe(apply)
        except RuntimeError:
            pass  # the caller's loop is closed: nobody is waiting any more

    def advance(self, n: int) -> bool:
        """Account for ``n`` more bytes in the kernel; True once the whole message is."""
        self.started = self.started or n > 0
        while n:
            head = self.segments[self.at]
            if n >= head.nbytes:
                n -= head.nbytes
                self.at += 1
            else:
                self.segments[self.at] = head[n:]
                n = 0
        return self.at == len(self.segments)


@dataclass
class Connection:
    """The connection to one destination and the messages queued for it, oldest first."""

    endpoint: str
    sock: socket.socket | None = None
    state: str = "down"
    """down (connect at ``retry_at``), connecting, handshake, ready."""
    retry_at: float = 0.0
    control: bytes = b""
    """Handshake bytes still to write (they go before any message)."""
    handshake: PeerHandshake = field(default_factory=PeerHandshake)
    queue: deque[PushCommand] = field(default_factory=deque)
    last_used: float = field(default_factory=time.monotonic)
    ever_ready: bool = False
    last_error: str = ""
    mask: int = 0
    """The selector events its socket is registered for (0: not registered)."""

    def connect(self, command: PushCommand) -> None:
        """Start a non-blocking connect to ``command``'s address; Broken when it fails at once."""
        sock = socket.socket(command.family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.mask, self.state = sock, 0, "connecting"
        self.handshake = PeerHandshake()
        self.control = GREETING + ready_command()
        err = sock.connect_ex(command.address)
        if err not in (0, errno.EINPROGRESS):
            raise Broken(f"cannot connect ({errno.errorcode.get(err, err)})")

    def on_events(self, events: int) -> None:
        """Progress on what the selector reported; Broken or ProtocolError when the connection is done for."""
        assert self.sock is not None
        if self.state == "connecting" and events & selectors.EVENT_WRITE:
            err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise Broken(f"cannot connect ({errno.errorcode.get(err, err)})")
            self.state = "handshake"
        if events & selectors.EVENT_READ:
            self.read()
        if events & selectors.EVENT_WRITE:
            self.write()

    def read(self) -> None:
        """Take what the peer sent (its handshake; anything later is ignored)."""
        assert self.sock is not None
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            raise Broken(f"connection broke ({exc.strerror or exc})") from None
        if not data:
            raise Broken("closed the connection")
        self.handshake.feed(data)
        if self.handshake.done and self.state == "handshake" and not self.control:
            self.state, self.ever_ready = "ready", True
            self.write()

    def write(self) -> None:
        """Write what the kernel takes now (handshake bytes, then messages in order); settle those now sent."""
        assert self.sock is not None
        sent: list[PushCommand] = []
        try:
            if self.control and self.state in ("handshake", "ready"):
                self.control = self.control[self.sock.send(self.control) :]
                if self.control:
                    return
                if self.handshake.done:
                    self.state, self.ever_ready = "ready", True
            while self.state == "ready" and self.queue:
                head = self.queue[0]
                if not head.started and head.future.done():
                    self.queue.popleft()  # the caller gave up before a byte went
                    continue
                n = self.sock.sendmsg(head.segments[head.at : head.at + _MAX_SEGMENTS])
                self.last_used = time.monotonic()
                if head.advance(n):
                    sent.append(self.queue.popleft())
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            for command in sent:
                command.settle()
            raise Broken(f"connection broke ({exc.strerror or exc})") from None
        for command in sent:
            command.settle()

    def wanted_events(self) -> int:
        """Read always; write while connecting, handshaking or holding messages."""
        writes = self.state == "connecting" or bool(self.control) or (self.state == "ready" and bool(self.queue))
        return selectors.EVENT_READ | (selectors.EVENT_WRITE if writes else 0)

    def close_socket(self, selector: selectors.BaseSelector | None) -> None:
        """Close the socket (a message cut off by it is dropped by the receiver); the queue stays."""
        sock, self.sock = self.sock, None
        if sock is None:
            return
        if self.mask and selector is not None:
            selector.unregister(sock)
        self.mask = 0
        drain(sock)  # unread input would make close() reset the connection and drop what the kernel holds
        sock.close()


def drain(sock: socket.socket) -> None:
    """Read and drop whatever a non-blocking socket holds."""
    while True:
        try:
            if not sock.recv(65536):
                return
        except (BlockingIOError, InterruptedError, OSError):
            return
