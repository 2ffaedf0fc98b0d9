"""Pushing frames to prefill servers: one thread owns a bounded pool of PUSH sockets.

ZMQ sockets are not thread-safe, so one sender thread owns all of them (an actor): the event
loop hands it a send command and awaits a future. The thread never blocks on a destination: it
tries a non-blocking send, and when the destination is not connected (``IMMEDIATE`` keeps ZMQ
from queueing for a peer that is not there) it parks the command and polls for writability until
the command's deadline. A dead prefill server therefore costs its own callers a timeout, and
nobody else anything.

Sockets are reused per destination, at most ``max_sockets`` of them; an idle one closes after
``idle_s``, and when the pool is full the least recently used idle one makes room. Closing uses
``linger_s`` so queued frames may still flush. Everything is created lazily on first use, so an
instance is safe to build before a worker process forks or spawns.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import zmq

from encoder_pod.errors import TransferFailed

log = logging.getLogger(__name__)

_IDLE_CHECK_S = 1.0


@dataclass
class _Send:
    endpoint: str
    frames: list[Any]
    deadline: float
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    timeout: float

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        """Resolve the caller's future from the sender thread (no-op if the caller gave up)."""

        def apply() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        try:
            self.loop.call_soon_threadsafe(apply)
        except RuntimeError:
            pass  # the caller's loop is closed: nobody is waiting any more


@dataclass
class _Slot:
    socket: zmq.Socket
    last_used: float
    pending: deque[_Send] = field(default_factory=deque)


def host_port(endpoint: str) -> str:
    """``tcp://host:port`` -> ``host:port`` (what error messages name)."""
    return endpoint.removeprefix("tcp://")


class PushSender:
    """Sends multipart messages to ``tcp://`` endpoints from one owner thread."""

    def __init__(self, *, max_sockets: int = 256, idle_s: float = 300.0, linger_s: float = 2.0) -> None:
        self.max_sockets = max_sockets
        self.idle_s = idle_s
        self.linger_ms = int(linger_s * 1000)
        self._commands: queue.SimpleQueue[_Send | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._ctx: zmq.Context | None = None
        self._wake_tx: zmq.Socket | None = None
        self._thread: threading.Thread | None = None
        self._slots: dict[str, _Slot] = {}
        self._closed = False
        self.open_sockets = 0
        """Sockets open right now (read by tests and metrics; written by the sender thread)."""

    # --- caller side (event loop) -----------------------------------------------------------
    def _ensure_started(self) -> None:
        with self._lock:
            if self._closed:
                raise TransferFailed("transfer is shutting down")
            if self._thread is not None:
                return
            self._ctx = zmq.Context()
            address = f"inproc://push-sender-wake-{id(self)}"
            wake_rx = self._ctx.socket(zmq.PAIR)
            wake_rx.bind(address)
            self._wake_tx = self._ctx.socket(zmq.PAIR)
            self._wake_tx.connect(address)
            self._thread = threading.Thread(target=self._run, args=(wake_rx,), name="zmq-push", daemon=True)
            self._thread.start()

    def _wake(self) -> None:
        with self._lock:
            if self._wake_tx is None:
                return
            try:
                self._wake_tx.send(b"", zmq.NOBLOCK)
            except zmq.Again:
                pass  # wake-ups already queued: the thread will see the command anyway

    async def send(self, endpoint: str, frames: list[Any], timeout: float) -> None:
        """Push one message to ``endpoint``; raise :class:`TransferFailed` naming it on failure or timeout.

        Returns once ZMQ has handed every byte to the kernel for a connected peer (zero-copy
        buffers are released), not merely queued it.
        """
        self._ensure_started()
        loop = asyncio.get_running_loop()
        command = _Send(endpoint, frames, time.monotonic() + timeout, loop, loop.create_future(), timeout)
        self._commands.put(command)
        self._wake()
        tracker = await command.future
        await self._wait_tracker(tracker, command)

    @staticmethod
    async def _wait_tracker(tracker: zmq.MessageTracker | None, command: _Send) -> None:
        # Polling with a short backoff instead of tracker.wait() in a thread: no thread per send.
        delay = 0.0002
        while tracker is not None and not tracker.done:
            if time.monotonic() >= command.deadline:
                raise TransferFailed(
                    f"{host_port(command.endpoint)} connected but did not take the data within {command.timeout:.3g}s"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)

    async def close(self) -> None:
        """Fail queued sends, close every socket (with linger) and stop the thread."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is None:
            return
        self._commands.put(None)
        self._wake()
        await asyncio.to_thread(thread.join, self.linger_ms / 1000 + 5)
        if thread.is_alive():
            # Terminating the context under a live socket would block forever: leave it to exit.
            log.warning("zmq push sender did not stop in time; leaving its sockets to process exit")
            return
        with self._lock:
            assert self._wake_tx is not None and self._ctx is not None
            self._wake_tx.close(linger=0)
            self._wake_tx = None
            ctx, self._ctx = self._ctx, None
        await asyncio.to_thread(ctx.term)

    # --- sender thread ----------------------------------------------------------------------
    def _run(self, wake_rx: zmq.Socket) -> None:
        last_idle_check = time.monotonic()
        try:
            while True:
                poller = zmq.Poller()
                poller.register(wake_rx, zmq.POLLIN)
                by_socket: dict[zmq.Socket, _Slot] = {}
                for slot in self._slots.values():
                    if slot.pending:
                        poller.register(slot.socket, zmq.POLLOUT)
                        by_socket[slot.socket] = slot
                events = dict(poller.poll(self._poll_ms()))
                if wake_rx in events:
                    self._drain(wake_rx)
                stop = self._take_commands()
                for sock, slot in by_socket.items():
                    if events.get(sock, 0) & zmq.POLLOUT:
                        self._flush(slot)
                now = time.monotonic()
                self._expire(now)
                if now - last_idle_check >= _IDLE_CHECK_S:
                    self._evict_idle(now)
                    last_idle_check = now
                if stop:
                    return
        except Exception:  # noqa: BLE001 - a dying sender must fail its callers, not hang them
            log.exception("zmq push sender crashed")
        finally:
            with self._lock:
                self._closed = True  # later sends fail at once instead of queueing for a dead thread
            self._shutdown(wake_rx)

    def _poll_ms(self) -> int:
        deadlines = [c.deadline for s in self._slots.values() for c in s.pending]
        wait = _IDLE_CHECK_S if not deadlines else min(deadlines) - time.monotonic()
        return max(0, min(int(wait * 1000) + 1, int(_IDLE_CHECK_S * 1000)))

    @staticmethod
    def _drain(wake_rx: zmq.Socket) -> None:
        while True:
            try:
                wake_rx.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    def _take_commands(self) -> bool:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return False
            if command is None:
                return True
            if command.future.done():
                continue  # the caller gave up (cancelled) before we got to it
            try:
                slot = self._slot_for(command.endpoint)
            except TransferFailed as err:
                command.settle(error=err)
                continue
            if slot.pending or not self._try_send(slot, command):
                slot.pending.append(command)

    def _try_send(self, slot: _Slot, command: _Send) -> bool:
        """True when the command is settled (sent or failed), False when it must wait."""
        try:
            tracker = slot.socket.send_multipart(command.frames, flags=zmq.NOBLOCK, copy=False, track=True)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            command.settle(error=TransferFailed(f"{host_port(command.endpoint)}: ZMQ send failed ({exc})"))
            return True
        slot.last_used = time.monotonic()
        command.settle(tracker)
        return True

    def _flush(self, slot: _Slot) -> None:
        while slot.pending:
            command = slot.pending[0]
            if not command.future.done() and not self._try_send(slot, command):
                return
            slot.pending.popleft()

    def _expire(self, now: float) -> None:
        for slot in self._slots.values():
            keep: deque[_Send] = deque()
            for command in slot.pending:
                if command.future.done():
                    continue
                if now >= command.deadline:
                    command.settle(
                        error=TransferFailed(
                            f"{host_port(command.endpoint)} accepted no connection within {command.timeout:.3g}s "
                            "(is the prefill server listening there?)"
                        )
                    )
                else:
                    keep.append(command)
            slot.pending = keep

    def _slot_for(self, endpoint: str) -> _Slot:
        slot = self._slots.get(endpoint)
        if slot is not None:
            return slot
        if len(self._slots) >= self.max_sockets:
            idle = [(s.last_used, ep) for ep, s in self._slots.items() if not s.pending]
            if not idle:
                raise TransferFailed(
                    f"{host_port(endpoint)}: all {self.max_sockets} pooled sockets are busy (ENCODER_TRANSFER_MAX_SOCKETS)"
                )
            self._close_slot(min(idle)[1])
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.PUSH)
        # IMMEDIATE: queue only for a completed connection, so a dead peer makes the send wait
        # (and time out) instead of "succeeding" into a queue nobody will ever read.
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.LINGER, self.linger_ms)
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise TransferFailed(f"{host_port(endpoint)}: cannot connect ({exc})") from None
        slot = self._slots[endpoint] = _Slot(sock, time.monotonic())
        self.open_sockets = len(self._slots)
        return slot

    def _close_slot(self, endpoint: str) -> None:
        slot = self._slots.pop(endpoint)
        slot.socket.close(linger=self.linger_ms)
        self.open_sockets = len(self._slots)

    def _evict_idle(self, now: float) -> None:
        for endpoint, slot in list(self._slots.items()):
            if not slot.pending and now - slot.last_used >= self.idle_s:
                log.debug("closing idle push socket to %s", endpoint)
                self._close_slot(endpoint)

    def _shutdown(self, wake_rx: zmq.Socket) -> None:
        stopping = TransferFailed("transfer is shutting down")
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if command is not None:
                command.settle(error=stopping)
        for endpoint in list(self._slots):
            for command in self._slots[endpoint].pending:
                command.settle(error=stopping)
            self._close_slot(endpoint)
        wake_rx.close(linger=0)
