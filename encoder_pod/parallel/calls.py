"""Calls from the front to its workers: send, await the typed answer until a deadline, cancel.

A call is registered on the worker's current :class:`~encoder_pod.parallel.handle.Incarnation`,
so a worker that dies fails exactly the calls it held (503) and an answer from a dead
incarnation is ignored. When the caller gives up (deadline, client gone) the worker is told to
drop the work.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from encoder_pod.errors import EncoderError, InvalidRequest, RequestTimeout
from encoder_pod.parallel.handle import WorkerRecord
from encoder_pod.parallel.messages import Call, Cancel, Error, Frame, ProtocolError, Result, pack

Answer = tuple[Result, list[Frame]]
"""A worker's Result and the raw frames after it."""


class Calls:
    """The front's calls in flight, by worker and call id."""

    def __init__(self, req_timeout: float) -> None:
        self._req_timeout = req_timeout
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        """A call id unique within this front."""
        return next(self._ids)

    async def call(self, handle: WorkerRecord, call_id: int, frames: list[Frame], deadline: float) -> Answer:
        """Send packed ``frames`` to ``handle``'s current process; its answer until ``deadline`` (loop time)."""
        loop = asyncio.get_running_loop()
        inc = handle.current
        future: asyncio.Future[Answer] = loop.create_future()
        try:
            handle.send(frames)  # WorkerDied / NotReady when there is no process to take it
            assert inc is not None
            inc.calls[call_id] = future
            return await asyncio.wait_for(future, max(0.0, deadline - loop.time()))
        except TimeoutError:
            self._cancel(handle, call_id)
            raise RequestTimeout(
                f"worker {handle.rank} did not answer within {self._req_timeout}s (ENCODER_REQ_TIMEOUT)"
            ) from None
        except asyncio.CancelledError:
            self._cancel(handle, call_id)  # the client is gone: the worker drops the work
            raise
        finally:
            if inc is not None:
                inc.calls.pop(call_id, None)

    @staticmethod
    def _cancel(handle: WorkerRecord, call_id: int) -> None:
        try:
            handle.send(pack(Cancel(call_id)))
        except EncoderError:
            pass  # the worker is gone; so is the work

    async def control(self, handle: WorkerRecord, op: str, args: dict[str, Any], timeout: float) -> Any:
        """A control operation on one worker; its answer's body."""
        msg = Call(self.next_id(), op, args)
        try:
            frames = pack(msg)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidRequest(f"body holds a value that cannot be forwarded to a worker ({exc})") from None
        result, _ = await self.call(handle, msg.call_id, frames, asyncio.get_running_loop().time() + timeout)
        return result.body

    @staticmethod
    def settle(handles: list[WorkerRecord], msg: Result | Error, extra: list[Frame]) -> None:
        """Hand a worker's answer to the call that waits for it (if anyone still does)."""
        if not 0 <= msg.rank < len(handles):
            raise ProtocolError(f"answer from unknown rank {msg.rank}")
        inc = handles[msg.rank].current
        if inc is None or msg.generation != inc.generation:
            return  # answered by an incarnation already declared dead: its caller got 503
        future = inc.calls.pop(msg.call_id, None)
        if future is None or future.done():
            return  # the caller gave up (timeout, disconnect)
        if isinstance(msg, Error):
            future.set_exception(msg.to_exception())
        else:
            future.set_result((msg, extra))
