"""Pushing frames to prefill servers: one thread owns every connection, and a failed push is never delivered.

The receivers are ZMQ PULL sockets; the sender speaks ZMTP to them over its own non-blocking TCP
connections (:mod:`encoder_pod.transfer.zmtp`, :mod:`encoder_pod.transfer.push_connection`), one
per destination, reused. The event loop hands the sender thread a command and awaits a future:
the thread never blocks on a destination, so a dead prefill server costs its own callers a
timeout, and nobody else anything.

What an answer means, exactly:

- **sent**: every byte of the message is in the kernel, on a connection whose peer completed the
  ZMTP handshake (what libzmq's ``IMMEDIATE`` gives). TCP delivers it unless that connection breaks.
- **failed** (:class:`TransferFailed`): nothing of the message is delivered, now or later. Either
  no byte of it was written (no connection, or the peer stopped reading before it began), or it
  was withdrawn: at its deadline the connection is closed with the message cut off, and a ZMQ
  receiver only ever hands out whole messages, so the part already written is dropped with the
  connection. Messages queued behind it were never begun and go on a fresh connection.

libzmq cannot give this: it marks a message sent only when its I/O thread next runs, which on a
connection whose peer stopped reading may not happen although every byte is in the kernel, and
a message it still holds is sent whenever the peer resumes, whatever the caller was told.

At most ``max_sockets`` connections are open at once; an idle one closes after ``idle_s``, and
when the limit is reached the least recently used idle one makes room. On :meth:`close`,
messages being written get ``linger_s`` to finish and are then withdrawn. Everything is created
lazily on first use, so an instance is safe to build before a worker process forks or spawns.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import selectors
import socket
import threading
import time
from typing import Any, Sequence

from encoder_pod.errors import TransferFailed
from encoder_pod.transfer.push_connection import Broken, Connection, PushCommand, drain, host_port, resolve
from encoder_pod.transfer.zmtp import ProtocolError, message_segments


def endpoint(host: str, port: int) -> str:
    """``tcp://host:port``, bracketing IPv6 literals."""
    return f"tcp://[{host}]:{port}" if ":" in host and not host.startswith("[") else f"tcp://{host}:{port}"

log = logging.getLogger(__name__)

__all__ = ["PushSender", "host_port"]

_IDLE_CHECK_S = 1.0
_RECONNECT_S = 0.1
"""Pause between connection attempts to a destination that refused or broke (libzmq's default)."""
_VERDICT_GRACE_S = 5.0
"""How long past its deadline a caller waits for the sender thread's verdict (a dead thread)."""


class PushSender:
    """Sends multipart messages to ZMQ PULL sockets at ``tcp://`` endpoints from one owner thread."""

    def __init__(self, *, max_sockets: int = 256, idle_s: float = 300.0, linger_s: float = 2.0) -> None:
        self.max_sockets = max_sockets
        self.idle_s = idle_s
        self.linger_s = linger_s
        self._commands: queue.SimpleQueue[PushCommand | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._wake_tx: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._conns: dict[str, Connection] = {}
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
            except OSError:
                pass  # wake-ups already queued (or stopping): the thread sees the command anyway

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
        family, address = await resolve(endpoint)
        loop = asyncio.get_running_loop()
        command = PushCommand(endpoint, family, address, message_segments(frames), deadline, loop, loop.create_future(), timeout)
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
                        drain(wake_rx)
                    else:
                        self._guarded(key.data, key.data.on_events, events)
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

    def _guarded(self, conn: Connection, step: Any, *args: Any) -> None:
        """Run one connection step; a broken connection goes down, a peer that is no PULL socket fails its queue."""
        try:
            step(*args)
        except Broken as exc:
            self._down(conn, str(exc))
        except ProtocolError as exc:
            self._fail_all(conn, TransferFailed(f"{host_port(conn.endpoint)}: {exc}"))

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
                self._guarded(conn, conn.connect, command)
            elif conn.state == "ready":
                self._guarded(conn, conn.write)

    def _open(self, endpoint: str) -> Connection:
        if len(self._conns) >= self.max_sockets:
            idle = [(c.last_used, ep) for ep, c in self._conns.items() if not c.queue]
            if not idle:
                raise TransferFailed(
                    f"{host_port(endpoint)}: all {self.max_sockets} pooled sockets are busy (ENCODER_TRANSFER_MAX_SOCKETS)"
                )
            self._close(self._conns[min(idle)[1]])
        conn = self._conns[endpoint] = Connection(endpoint)
        self.open_sockets = len(self._conns)
        return conn

    def _expire(self, now: float) -> None:
        for conn in list(self._conns.values()):
            head = conn.queue[0] if conn.queue else None
            if head is not None and head.started and now >= head.deadline:
                conn.queue.popleft()
                self._down(conn, "stalled", retry_s=0.0)  # the close cuts the message off: its receiver drops it
                head.settle(
                    TransferFailed(
                        f"{host_port(conn.endpoint)} connected but did not take the data within {head.timeout:.3g}s; "
                        "withdrawn: nothing of it will be delivered"
                    )
                )
                log.warning("push to %s stalled: withdrew a message cut off at its deadline", host_port(conn.endpoint))
            for command in [c for c in conn.queue if not c.started and now >= c.deadline]:
                conn.queue.remove(command)
                command.settle(TransferFailed(_never_sent(conn, command)))
            if not conn.queue and conn.state != "ready":
                self._close(conn)

    def _down(self, conn: Connection, reason: str, retry_s: float = _RECONNECT_S) -> None:
        """Close the connection; a message it cut off fails, the others wait for the next connection."""
        conn.close_socket(self._selector)
        conn.state, conn.last_error, conn.retry_at = "down", reason, time.monotonic() + retry_s
        head = conn.queue[0] if conn.queue else None
        if head is not None and head.started:
            conn.queue.popleft()
            head.settle(TransferFailed(f"{host_port(conn.endpoint)}: {reason} while this message was sent; nothing of it is delivered"))
        if not conn.queue:
            self._close(conn)

    def _reconnect(self, now: float) -> None:
        for conn in list(self._conns.values()):
            if conn.state == "down" and conn.queue and now >= conn.retry_at:
                self._guarded(conn, conn.connect, conn.queue[0])

    def _fail_all(self, conn: Connection, error: TransferFailed) -> None:
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
            if conn.sock is None or (mask := conn.wanted_events()) == conn.mask:
                continue
            if conn.mask:
                self._selector.modify(conn.sock, mask, conn)
            else:
                self._selector.register(conn.sock, mask, conn)
            conn.mask = mask

    def _close(self, conn: Connection) -> None:
        conn.close_socket(self._selector)
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
            conn.close_socket(self._selector)  # a message cut off here is dropped by its receiver
            if conn.queue and conn.queue[0].started:
                conn.queue.popleft().settle(
                    TransferFailed(f"{host_port(conn.endpoint)}: the transfer shut down while this message was sent; withdrawn")
                )
            self._fail_all(conn, stopping)
        if self._selector is not None:
            self._selector.close()
        wake_rx.close()


def _never_sent(conn: Connection, command: PushCommand) -> str:
    where, took = host_port(conn.endpoint), f"{command.timeout:.3g}s"
    if conn.ever_ready:
        return f"{where} stopped reading: nothing of this message was sent within {took}"
    detail = f"; {conn.last_error}" if conn.last_error else ""
    return f"{where} accepted no connection within {took} (is the prefill server listening there?{detail})"
