"""Pushing frames to prefill servers: one thread owns every connection, and a failed push is never delivered.

The receivers are ZMQ PULL sockets; the sender speaks ZMTP to them over its own non-blocking TCP
connections (:mod:`encoder_pod.transfer.zmtp`), one per destination, reused. The event loop hands
the sender thread a send command and awaits a future: the thread never blocks on a destination,
so a dead prefill server costs its own callers a timeout, and nobody else anything.

What an answer means, exactly:

- **sent**: every byte of the message is in the kernel, on a connection whose peer completed the
  ZMTP handshake (what libzmq's ``IMMEDIATE`` gives). TCP delivers it unless that connection breaks.
- **failed** (:class:`TransferFailed`): nothing of the message is delivered, now or later. Either
  no byte of it was written (no connection, the peer stopped reading before it began), or it was
  withdrawn: at its deadline the connection is closed with the message cut off, and a ZMQ
  receiver only ever hands out whole messages, so the part already written is dropped with the
  connection. Messages queued behind it were never begun and go on a fresh connection.

libzmq cannot give this: it marks a message sent only when its I/O thread next runs, which on a
connection whose peer stopped reading may never happen although every byte is in the kernel,
and a message it still queues is sent whenever the peer resumes.

At most ``max_sockets`` connections are open at once; an idle one closes after ``idle_s``, and
when the limit is reached the least recently used idle one makes room. On :meth:`close`,
messages being written get ``linger_s`` to finish and are then withdrawn. Everything is created
lazily on first use, so an instance is safe to build before a worker process forks or spawns.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import queue
import selectors
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

from encoder_pod.errors import TransferFailed
from encoder_pod.transfer.zmtp import GREETING, PeerHandshake, ProtocolError, message_segments, ready_command

log = logging.getLogger(__name__)

_IDLE_CHECK_S = 1.0
_RECONNECT_S = 0.1
"""Pause between connection attempts to a destination that refused or broke (libzmq's default)."""
_VERDICT_GRACE_S = 5.0
"""How long past its deadline a caller waits for the sender thread's verdict (a dead thread)."""
_MAX_SEGMENTS = 64


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


@dataclass
class _Send:
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
    """Some byte of it is in the kernel: from now on it is either finished or withdrawn."""

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
class _Conn:
    endpoint: str
    sock: socket.socket | None = None
    state: str = "down"
    """down (waiting to connect at ``retry_at``), connecting, handshake, ready."""
    retry_at: float = 0.0
    control: bytes = b""
    """Handshake bytes still to write (they go before any message)."""
    handshake: PeerHandshake = field(default_factory=PeerHandshake)
    queue: deque[_Send] = field(default_factory=deque)
    last_used: float = field(default_factory=time.monotonic)
    ever_ready: bool = False
    last_error: str = ""
    mask: int = 0
    """The selector events it is registered for (0: not registered)."""


class PushSender:
    """Sends multipart messages to ZMQ PULL sockets at ``tcp://`` endpoints from one owner thread."""

    def __init__(self, *, max_sockets: int = 256, idle_s: float = 300.0, linger_s: float = 2.0) -> None:
        self.max_sockets = max_sockets
        self.idle_s = idle_s
        self.linger_s = linger_s
        self._commands: queue.SimpleQueue[_Send | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._wake_tx: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._conns: dict[str, _Conn] = {}
        self._selector: selectors.BaseSelector | None = None
        self._closed = False
        self.open_sockets = 0
        """Connections held right now (read by tests and metrics; written by the sender thread)."""

    # --- caller side (event loop) -----------------------------------------------------------
    def _ensure_started(self) -> None:
        with self._lock:
            if self._closed:
                raise TransferFailed("transfer is shutting down")
            if self._thread is not None:
                return
            wake_rx, self._wake_tx = socket.socketpair()
            wake_rx.setblocking(False)
            self._wake_tx.setblocking(False)
            self._thread = threading.Thread(target=self._run, args=(wake_rx,), name="zmq-push", daemon=True)
            self._thread.start()

    def _wake(self) -> None:
        with self._lock:
            if self._wake_tx is None:
                return
            try:
                self._wake_tx.send(b"\0")
            except (BlockingIOError, OSError):
                pass  # wake-ups already queued: the thread will see the command anyway

    async def send(self, endpoint: str, frames: Sequence[Any], timeout: float) -> None:
        """Push one message to ``endpoint`` within ``timeout`` seconds.

        Returns once every byte is in the kernel for a peer that completed the handshake. Raises
        :class:`TransferFailed`, naming the endpoint, when it could not; then nothing of the
        message is delivered, now or later (see the module docstring).
        """
        if not frames:
            raise ValueError("a ZMQ message has at least one frame")
        deadline = time.monotonic() + timeout
        self._ensure_started()
        family, address = await _resolve(endpoint)
        loop = asyncio.get_running_loop()
        command = _Send(endpoint, family, address, message_segments(frames), deadline, loop, loop.create_future(), timeout)
        self._commands.put(command)
        self._wake()
        try:
            await asyncio.wait_for(command.future, max(deadline - time.monotonic(), 0) + _VERDICT_GRACE_S)
        except TimeoutError:
            raise TransferFailed(f"{host_port(endpoint)}: the push sender gave no verdict (it stopped)") from None

    async def close(self) -> None:
        """Fail queued sends, give those being written ``linger_s``, withdraw the rest, stop the thread."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is None:
            return
        self._commands.put(None)
        self._wake()
        await asyncio.to_thread(thread.join, self.linger_s + 5)
        if thread.is_alive():
            log.warning("push sender did not stop in time; leaving its connections to process exit")
            return
        with self._lock:
            if self._wake_tx is not None:
                self._wake_tx.close()
                self._wake_tx = None

    # --- sender thread ----------------------------------------------------------------------
    def _run(self, wake_rx: socket.socket) -> None:
        self._selector = selectors.DefaultSelector()
        self._selector.register(wake_rx, selectors.EVENT_READ, None)
        last_idle_check = time.monotonic()
        stop_by: float | None = None
        try:
            while True:
                for key, events in self._selector.select(self._select_timeout(stop_by)):
                    if key.data is None:
                        _drain(wake_rx)
                    else:
                        self._on_events(key.data, events)
                if self._take_commands() and stop_by is None:
                    stop_by = time.monotonic() + self.linger_s
                    self._fail_unstarted(TransferFailed("transfer is shutting down"))
                now = time.monotonic()
                self._expire(now)
                self._reconnect(now)
                if now - last_idle_check >= _IDLE_CHECK_S:
                    self._evict_idle(now)
                    last_idle_check = now
                self._update_interest()
                if stop_by is not None and (now >= stop_by or not any(c.queue for c in self._conns.values())):
                    return
        except Exception:  # noqa: BLE001 - a dying sender must fail its callers, not hang them
            log.exception("push sender crashed")
        finally:
            with self._lock:
                self._closed = True  # later sends fail at once instead of queueing for a dead thread
            self._shutdown(wake_rx)

    def _select_timeout(self, stop_by: float | None) -> float:
        now = time.monotonic()
        times = [now + _IDLE_CHECK_S] if stop_by is None else [stop_by]
        for conn in self._conns.values():
            times.extend(c.deadline for c in conn.queue)
            if conn.state == "down" and conn.queue:
                times.append(conn.retry_at)
        return max(0.0, min(times) - now)

    def _take_commands(self) -> bool:
        """Queue new commands on their destination's connection; True when told to stop."""
        stop = False
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return stop
            if command is None:
                stop = True
                continue
            if command.future.done():
                continue  # the caller gave up (cancelled) before we got to it
            conn = self._conns.get(command.endpoint)
            if conn is None:
                try:
                    conn = self._open(command.endpoint)
                except TransferFailed as err:
                    command.settle(err)
                    continue
            conn.queue.append(command)
            if conn.state == "down" and conn.retry_at <= time.monotonic():
                self._connect(conn, command)
            elif conn.state == "ready":
                self._write(conn)

    def _open(self, endpoint: str) -> _Conn:
        if len(self._conns) >= self.max_sockets:
            idle = [(c.last_used, ep) for ep, c in self._conns.items() if not c.queue]
            if not idle:
                raise TransferFailed(
                    f"{host_port(endpoint)}: all {self.max_sockets} pooled sockets are busy (ENCODER_TRANSFER_MAX_SOCKETS)"
                )
            self._close(self._conns[min(idle)[1]])
        conn = self._conns[endpoint] = _Conn(endpoint)
        self.open_sockets = len(self._conns)
        return conn

    def _connect(self, conn: _Conn, command: _Send) -> None:
        sock = socket.socket(command.family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = sock.connect_ex(command.address)
        conn.sock, conn.mask = sock, 0
        conn.handshake = PeerHandshake()
        conn.control = GREETING + ready_command()
        conn.state = "connecting"
        if err not in (0, errno.EINPROGRESS):
            self._down(conn, f"cannot connect ({errno.errorcode.get(err, err)})")

    def _on_events(self, conn: _Conn, events: int) -> None:
        if conn.sock is None:
            return
        if conn.state == "connecting" and events & selectors.EVENT_WRITE:
            err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._down(conn, f"cannot connect ({errno.errorcode.get(err, err)})")
                return
            conn.state = "handshake"
        if events & selectors.EVENT_READ:
            self._read(conn)
        if conn.sock is not None and events & selectors.EVENT_WRITE:
            self._write(conn)

    def _read(self, conn: _Conn) -> None:
        assert conn.sock is not None
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._down(conn, f"connection broke ({exc.strerror or exc})")
            return
        if not data:
            self._down(conn, "closed the connection")
            return
        try:
            conn.handshake.feed(data)
        except ProtocolError as exc:
            self._fail_all(conn, TransferFailed(f"{host_port(conn.endpoint)}: {exc}"))
            return
        if conn.handshake.done and conn.state == "handshake" and not conn.control:
            conn.state, conn.ever_ready = "ready", True
            self._write(conn)

    def _write(self, conn: _Conn) -> None:
        """Write what the kernel takes now: handshake bytes, then messages in order."""
        assert conn.sock is not None
        try:
            if conn.control and conn.state in ("handshake", "ready"):
                conn.control = conn.control[conn.sock.send(conn.control) :]
                if conn.control:
                    return
                if conn.handshake.done:
                    conn.state, conn.ever_ready = "ready", True
            while conn.state == "ready" and conn.queue:
                head = conn.queue[0]
                if not head.started and head.future.done():
                    conn.queue.popleft()  # the caller gave up before a byte went
                    continue
                n = conn.sock.sendmsg(head.segments[head.at : head.at + _MAX_SEGMENTS])
                conn.last_used = time.monotonic()
                if not head.advance(n):
                    continue  # the kernel took part of it: try the rest (it says when it is full)
                conn.queue.popleft()
                head.settle()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._down(conn, f"connection broke ({exc.strerror or exc})")

    def _expire(self, now: float) -> None:
        for conn in list(self._conns.values()):
            head = conn.queue[0] if conn.queue else None
            if head is not None and head.started and now >= head.deadline:
                conn.queue.popleft()
                self._down(conn, "stalled", withdraw=False)  # closing cuts the message off: the receiver drops it
                head.settle(
                    TransferFailed(
                        f"{host_port(conn.endpoint)} connected but did not take the data within {head.timeout:.3g}s; "
                        "withdrawn: nothing of it will be delivered"
                    )
                )
                log.warning("push to %s stalled: withdrew a message cut off at its deadline", host_port(conn.endpoint))
            for command in [c for c in conn.queue if not c.started and now >= c.deadline]:
                conn.queue.remove(command)
                command.settle(TransferFailed(self._never_sent(conn, command)))
            if not conn.queue and conn.state != "ready":
                self._close(conn)

    @staticmethod
    def _never_sent(conn: _Conn, command: _Send) -> str:
        where, t = host_port(conn.endpoint), f"{command.timeout:.3g}s"
        if conn.ever_ready:
            return f"{where} stopped reading: nothing of this message was sent within {t}"
        detail = f"; {conn.last_error}" if conn.last_error else ""
        return f"{where} accepted no connection within {t} (is the prefill server listening there?{detail})"

    def _down(self, conn: _Conn, reason: str, withdraw: bool = True) -> None:
        """Close the connection; a message cut off fails (withdrawn), the others wait for the next one."""
        self._close_socket(conn)
        conn.state, conn.last_error = "down", reason
        conn.retry_at = time.monotonic() + (0.0 if reason == "stalled" else _RECONNECT_S)
        head = conn.queue[0] if conn.queue else None
        if withdraw and head is not None and head.started:
            conn.queue.popleft()
            head.settle(TransferFailed(f"{host_port(conn.endpoint)} {reason} while this message was sent; nothing of it is delivered"))
        if not conn.queue:
            self._close(conn)

    def _reconnect(self, now: float) -> None:
        for conn in list(self._conns.values()):
            if conn.state == "down" and conn.queue and now >= conn.retry_at:
                self._connect(conn, conn.queue[0])

    def _fail_all(self, conn: _Conn, error: TransferFailed) -> None:
        for command in conn.queue:
            command.settle(error)
        conn.queue.clear()
        self._close(conn)

    def _fail_unstarted(self, error: TransferFailed) -> None:
        for conn in list(self._conns.values()):
            for command in [c for c in conn.queue if not c.started]:
                conn.queue.remove(command)
                command.settle(error)

    def _evict_idle(self, now: float) -> None:
        for conn in list(self._conns.values()):
            if not conn.queue and now - conn.last_used >= self.idle_s:
                log.debug("closing idle push connection to %s", conn.endpoint)
                self._close(conn)

    def _update_interest(self) -> None:
        assert self._selector is not None
        for conn in self._conns.values():
            if conn.sock is None:
                continue
            wants_write = conn.state == "connecting" or bool(conn.control) or (conn.state == "ready" and bool(conn.queue))
            mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if wants_write else 0)
            if mask == conn.mask:
                continue
            if conn.mask:
                self._selector.modify(conn.sock, mask, conn)
            else:
                self._selector.register(conn.sock, mask, conn)
            conn.mask = mask

    def _close_socket(self, conn: _Conn) -> None:
        sock, conn.sock = conn.sock, None
        if sock is None:
            return
        if conn.mask and self._selector is not None:
            self._selector.unregister(sock)
        conn.mask = 0
        _drain(sock)  # unread input would make close() reset the connection and drop what the kernel holds
        sock.close()

    def _close(self, conn: _Conn) -> None:
        self._close_socket(conn)
        if self._conns.get(conn.endpoint) is conn:
            del self._conns[conn.endpoint]
        self.open_sockets = len(self._conns)

    def _shutdown(self, wake_rx: socket.socket) -> None:
        stopping = TransferFailed("transfer is shutting down")
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if command is not None:
                command.settle(stopping)
        for conn in list(self._conns.values()):
            head = conn.queue[0] if conn.queue else None
            self._close_socket(conn)  # a message cut off here is dropped by its receiver
            if head is not None and head.started:
                head.settle(TransferFailed(f"{host_port(conn.endpoint)}: the transfer shut down while this message was sent; withdrawn"))
                conn.queue.popleft()
            self._fail_all(conn, stopping)
        if self._selector is not None:
            self._selector.close()
        wake_rx.close()


def _drain(sock: socket.socket) -> None:
    while True:
        try:
            if not sock.recv(65536):
                return
        except (BlockingIOError, InterruptedError, OSError):
            return


async def _resolve(endpoint: str) -> tuple[int, tuple[Any, ...]]:
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
