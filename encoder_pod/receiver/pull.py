"""Receiving embeddings on a prefill server: a PULL socket, sync and async.

Both classes bind one PULL socket that every encoder pushes to, feed each message to an
:class:`~encoder_pod.receiver.assembly.Assembler`, and hand results out by request id. A bad
message never stops the receiving loop: it fails its own request (or is counted as rejected).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, cast

import zmq

from encoder_pod.receiver.assembly import Assembler, Completed, Failed, Outcome, ReceivedEmbedding, Rejected
from encoder_pod.receiver.errors import ReceiverClosed, ReceiverError, WaitTimeout

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 1 << 30

DRAIN_BATCH = 64
"""Messages the async receiver takes in one loop turn before it lets other callbacks run."""


class _Inbox:
    """Outcomes nobody claimed yet, by request id; bounded and expired like pending requests."""

    def __init__(self, expire_after: float, max_items: int) -> None:
        self._items: dict[str, tuple[float, Completed | Failed]] = {}
        self._expire_after = expire_after
        self._max_items = max_items

    def put(self, outcome: Completed | Failed, now: float) -> None:
        if len(self._items) >= self._max_items:
            oldest = min(self._items, key=lambda k: self._items[k][0])
            log.warning("dropping unclaimed result of request %r (inbox full)", oldest)
            del self._items[oldest]
        self._items[outcome.request_id] = (now, outcome)

    def take(self, request_id: str) -> Completed | Failed | None:
        item = self._items.pop(request_id, None)
        return item[1] if item else None

    def expire(self, now: float) -> None:
        for request_id, (at, _) in list(self._items.items()):
            if now - at >= self._expire_after:
                log.warning("dropping result of request %r: nobody claimed it in %gs", request_id, self._expire_after)
                del self._items[request_id]


def _unwrap(outcome: Completed | Failed) -> ReceivedEmbedding:
    if isinstance(outcome, Failed):
        raise outcome.error
    return outcome.result


def _configure(sock: zmq.Socket, host: str, port: int, max_message_bytes: int) -> int:
    # A message over this size makes ZMQ drop the sender's connection: memory stays bounded.
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    sock.setsockopt(zmq.LINGER, 0)
    if port == 0:
        return sock.bind_to_random_port(f"tcp://{host}")
    sock.bind(f"tcp://{host}:{port}")
    return port


class _Base:
    """What both receivers share: the assembler, the inbox and counters."""

    def __init__(self, expire_after: float, max_pending: int, on_rejected: Callable[[ReceiverError], None] | None) -> None:
        self._assembler = Assembler(expire_after=expire_after, max_pending=max_pending)
        self._inbox = _Inbox(expire_after, max_pending)
        self._on_rejected = on_rejected
        self.rejected = 0
        """Messages that named no usable request (garbage, truncated headers)."""

    def _accept(self, frames: list[Any], now: float) -> list[Outcome]:
        try:
            outcome = self._assembler.feed(frames, now)
        except Exception as exc:  # noqa: BLE001 - the receive loop must outlive any one message
            log.exception("unexpected error decoding a message; dropped")
            outcome = Rejected(ReceiverError(f"unexpected {type(exc).__name__}: {exc}"))  # type: ignore[arg-type]
        outcomes: list[Outcome] = [] if outcome is None else [outcome]
        outcomes.extend(self._assembler.expire(now))
        self._inbox.expire(now)
        for item in outcomes:
            if isinstance(item, Rejected):
                self.rejected += 1
                log.warning("rejected a message: %s", item.error.message)
                if self._on_rejected is not None:
                    self._on_rejected(item.error)
        return outcomes


class EmbeddingReceiver(_Base):
    """Blocking receiver, for a scheduler loop that polls (``poll``) or a caller that waits (``wait``).

    Use ``poll`` and ``wait`` from one thread. ``poll`` hands out every outcome it sees;
    ``wait(request_id)`` keeps outcomes of other requests for their own ``wait`` calls.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        expire_after: float = 180.0,
        max_pending: int = 1024,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        on_rejected: Callable[[ReceiverError], None] | None = None,
    ) -> None:
        super().__init__(expire_after, max_pending, on_rejected)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        try:
            self.port = _configure(self._sock, host, port, max_message_bytes)
        except zmq.ZMQError:
            self.close()
            raise
        self.host = host

    def poll(self, timeout: float | None = 0.0) -> list[Outcome]:
        """Wait up to ``timeout`` seconds (None: forever) for a message, then drain what is queued."""
        outcomes: list[Outcome] = []
        wait_ms = None if timeout is None else max(int(timeout * 1000), 0)
        if self._sock.poll(wait_ms, zmq.POLLIN):
            while True:
                try:
                    frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                outcomes.extend(self._accept(frames, time.monotonic()))
        else:
            outcomes.extend(self._assembler.expire(time.monotonic()))
        return outcomes

    def wait(self, request_id: str, timeout: float | None = None) -> ReceivedEmbedding:
        """The merged embedding of ``request_id``; raises the request's typed error or :class:`WaitTimeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            found = self._inbox.take(request_id)
            if found is not None:
                return _unwrap(found)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeout(f"request {request_id!r} not complete within {timeout}s", req_id=request_id)
            step = 1.0 if left is None else min(left, 1.0)
            for outcome in self.poll(step):
                if not isinstance(outcome, Rejected):
                    self._inbox.put(outcome, time.monotonic())

    def close(self) -> None:
        """Close the socket and its context."""
        self._sock.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> "EmbeddingReceiver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEmbeddingReceiver(_Base):
    """asyncio receiver: the loop reads the socket when it is readable; ``await wait(request_id)`` from anywhere on the loop.

    The socket is a plain ZMQ socket whose notification descriptor the loop watches
    (``add_reader``): a message is decoded in the same loop turn that sees it, with none of
    ``zmq.asyncio``'s futures in between. A task of its own expires stale parts.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        expire_after: float = 180.0,
        max_pending: int = 1024,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        on_rejected: Callable[[ReceiverError], None] | None = None,
    ) -> None:
        super().__init__(expire_after, max_pending, on_rejected)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        try:
            self.port = _configure(self._sock, host, port, max_message_bytes)
        except zmq.ZMQError:
            self._sock.close(linger=0)
            self._ctx.term()
            raise
        self.host = host
        self._fd = cast(int, self._sock.getsockopt(zmq.FD))
        self._waiters: dict[str, asyncio.Future[ReceivedEmbedding]] = {}
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def start(self) -> None:
        """Start reading on the running loop (``async with`` does it)."""
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self._fd, self._read_ready)
            self._task = self._loop.create_task(self._expire_loop(), name="embedding-receiver")
            self._read_ready()  # what came before: the descriptor only signals new arrivals

    def _read_ready(self) -> None:
        """Take every message waiting now (at most :data:`DRAIN_BATCH`, then the loop's turn).

        ZMQ's descriptor is edge-triggered: it signals once for any number of messages, so the
        socket is drained until its events say empty, and a drain cut short is resumed soon.
        """
        if self._closed or self._loop is None:
            return
        try:
            for _ in range(DRAIN_BATCH):
                if not cast(int, self._sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                    return
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
                self._dispatch(self._accept(frames, time.monotonic()))
        except zmq.Again:
            return
        except Exception:  # noqa: BLE001 - never let one bad turn stop the receiving
            log.exception("embedding receiver read error; continuing")
            self._loop.call_later(0.01, self._read_ready)
            return
        self._loop.call_soon(self._read_ready)

    async def _expire_loop(self) -> None:
        while True:
            next_expiry = self._assembler.next_expiry()
            wait_s = 1.0 if next_expiry is None else max(0.0, min(1.0, next_expiry - time.monotonic() + 0.001))
            await asyncio.sleep(wait_s)
            now = time.monotonic()
            self._dispatch(list(self._assembler.expire(now)))
            self._inbox.expire(now)
            self._read_ready()  # a safety net: an edge the descriptor never signalled

    def _dispatch(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            if isinstance(outcome, Rejected):
                continue
            waiter = self._waiters.pop(outcome.request_id, None)
            if waiter is None or waiter.done():
                self._inbox.put(outcome, time.monotonic())
            elif isinstance(outcome, Failed):
                waiter.set_exception(outcome.error)
            else:
                waiter.set_result(outcome.result)

    async def wait(self, request_id: str, timeout: float | None = None) -> ReceivedEmbedding:
        """The merged embedding of ``request_id``; raises the request's typed error or :class:`WaitTimeout`."""
        if self._closed:
            raise ReceiverClosed("receiver is closed", req_id=request_id)
        self.start()
        found = self._inbox.take(request_id)
        if found is not None:
            return _unwrap(found)
        waiter = self._waiters.get(request_id)
        if waiter is None:
            waiter = self._waiters[request_id] = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            raise WaitTimeout(f"request {request_id!r} not complete within {timeout}s", req_id=request_id) from None
        finally:
            # A timed-out or cancelled caller leaves no waiter behind: a later outcome goes to the inbox.
            if not waiter.done() and self._waiters.get(request_id) is waiter:
                del self._waiters[request_id]

    async def close(self) -> None:
        """Stop the reader, fail every waiter with :class:`ReceiverClosed`, close the socket."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            if self._loop is not None:
                self._loop.remove_reader(self._fd)
        for request_id, waiter in self._waiters.items():
            if not waiter.done():
                waiter.set_exception(ReceiverClosed("receiver closed while waiting", req_id=request_id))
                waiter.exception()  # retrieved: nobody else may be awaiting the shielded future
        self._waiters.clear()
        self._sock.close(linger=0)
        self._ctx.term()

    async def __aenter__(self) -> "AsyncEmbeddingReceiver":
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
