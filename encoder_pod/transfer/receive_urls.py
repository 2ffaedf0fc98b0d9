"""zmq_to_scheduler registrations: where each prefill rank receives a request's embedding.

With ``embedding_port: null`` every prefill TP rank POSTs ``/scheduler_receive_url`` with
``{req_id, receive_count, receive_url: "host:port", modality}``, before or after ``/encode``
arrives. The delivery waits until ``receive_count`` distinct URLs are in, up to SEND_TIMEOUT,
then pushes to each. State lives on the event loop that serves both routes; every entry is
removed when its delivery takes it, when its wait times out, or ``ttl`` after its first
registration if no ``/encode`` ever comes; the table is bounded (429 beyond).

The route is declared here, once (:data:`CONTROL_OPS`): auto and zmq_to_scheduler serve it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from encoder_pod.errors import InvalidRequest, Overloaded, TransferFailed
from encoder_pod.modality import Modality
from encoder_pod.protocol import MAX_REQ_ID_LEN
from encoder_pod.settings import TransferBackend
from encoder_pod.transfer.control import ControlOp

MAX_RECEIVE_COUNT = 1024


def parse_receive_url(value: Any, req_id: str | None = None) -> str:
    """``"host:port"`` or ``"[v6]:port"`` -> ``tcp://`` endpoint; InvalidRequest names the field."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest("field 'receive_url': required, \"host:port\"", req_id=req_id)
    text = value.strip().removeprefix("tcp://")
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        bracket = True
    else:
        host, sep, port = text.rpartition(":")
        bracket = False
    bad_host = not host or any(c in host for c in "/ []@?#") or (":" in host and not bracket)
    if bracket:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            bad_host = True
    if not sep or bad_host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InvalidRequest(f"field 'receive_url': {value!r:.80} is not \"host:port\" with a port in 1..65535", req_id=req_id)
    return f"tcp://[{host}]:{int(port)}" if bracket else f"tcp://{host}:{int(port)}"


@dataclass(frozen=True)
class Registration:
    """A validated /scheduler_receive_url body."""

    req_id: str
    receive_count: int
    endpoint: str
    modality: Modality | None


def parse_registration(payload: dict[str, Any]) -> Registration:
    """Validate a registration body; every rejection names the field."""
    req_id = payload.get("req_id")
    if not isinstance(req_id, str) or not 0 < len(req_id) <= MAX_REQ_ID_LEN:
        raise InvalidRequest(f"field 'req_id': required, a string of 1..{MAX_REQ_ID_LEN} characters")
    count = payload.get("receive_count")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_RECEIVE_COUNT:
        raise InvalidRequest(f"field 'receive_count': an integer in 1..{MAX_RECEIVE_COUNT}, got {count!r:.40}", req_id=req_id)
    modality = payload.get("modality")
    try:
        parsed = None if modality is None else Modality.parse(modality)
    except ValueError as exc:
        raise InvalidRequest(f"field 'modality': {exc}", req_id=req_id) from None
    return Registration(req_id, count, parse_receive_url(payload.get("receive_url"), req_id), parsed)


@dataclass
class _Entry:
    receive_count: int
    created: float
    endpoints: list[str] = field(default_factory=list)
    complete: asyncio.Event = field(default_factory=asyncio.Event)
    on_complete: Callable[[tuple[str, ...]], None] | None = None
    waiting: bool = False


class ReceiveUrlTable:
    """Registrations by req_id, bounded and expiring; used from one event loop."""

    def __init__(self, *, ttl: float, max_entries: int) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def register(self, reg: Registration) -> None:
        """Add one rank's URL; completes the entry at ``receive_count`` distinct URLs."""
        self.sweep()
        entry = self._entries.get(reg.req_id)
        if entry is None:
            if len(self._entries) >= self.max_entries:
                raise Overloaded(f"{self.max_entries} receive-URL registrations pending (ENCODER_MAX_QUEUE); retry later", req_id=reg.req_id)
            entry = self._entries[reg.req_id] = _Entry(reg.receive_count, time.monotonic())
        if not entry.receive_count:
            entry.receive_count = reg.receive_count  # the delivery arrived first and did not know it
        if entry.receive_count != reg.receive_count:
            raise InvalidRequest(
                f"field 'receive_count': {reg.receive_count} disagrees with {entry.receive_count} registered earlier for this req_id",
                req_id=reg.req_id,
            )
        if reg.endpoint in entry.endpoints:
            return  # a retried registration is harmless
        if len(entry.endpoints) >= entry.receive_count:
            raise InvalidRequest(
                f"req_id already has all {entry.receive_count} receive URLs; {reg.endpoint} is one too many", req_id=reg.req_id
            )
        entry.endpoints.append(reg.endpoint)
        if len(entry.endpoints) == entry.receive_count:
            entry.complete.set()
            if entry.on_complete is not None:
                del self._entries[reg.req_id]
                entry.on_complete(tuple(entry.endpoints))

    async def wait(self, req_id: str, timeout: float) -> tuple[str, ...]:
        """Every registered endpoint of ``req_id`` once complete; removes the entry either way."""
        self.sweep()
        entry = self._entries.get(req_id)
        if entry is None:
            if len(self._entries) >= self.max_entries:
                raise Overloaded(f"{self.max_entries} receive-URL registrations pending (ENCODER_MAX_QUEUE); retry later", req_id=req_id)
            # Encode before registration: hold a slot the registrations will fill.
            entry = self._entries[req_id] = _Entry(0, time.monotonic())
        entry.waiting = True
        try:
            await asyncio.wait_for(entry.complete.wait(), max(timeout, 0))
        except TimeoutError:
            have = len(entry.endpoints)
            want = entry.receive_count or "the announced number of"
            raise TransferFailed(
                f"only {have} of {want} receive URLs were registered through /scheduler_receive_url "
                f"within {timeout:g}s (ENCODER_SEND_TIMEOUT)",
                req_id=req_id,
            ) from None
        finally:
            if self._entries.get(req_id) is entry:
                del self._entries[req_id]
        return tuple(entry.endpoints)

    def take_or_defer(self, req_id: str, callback: Callable[[tuple[str, ...]], None]) -> tuple[str, ...] | None:
        """Endpoints of a complete entry now, or None after arranging ``callback`` for when it completes.

        Used for error parts: the HTTP caller gets its answer at once, and the ranks still get the
        error whenever their registrations arrive (within ``ttl``).
        """
        self.sweep()
        entry = self._entries.get(req_id)
        if entry is not None and entry.receive_count and len(entry.endpoints) == entry.receive_count:
            del self._entries[req_id]
            return tuple(entry.endpoints)
        if entry is None:
            if len(self._entries) >= self.max_entries:
                return None
            entry = self._entries[req_id] = _Entry(0, time.monotonic())
        entry.on_complete = callback
        return None

    def discard(self, req_id: str) -> None:
        """Forget ``req_id``'s registrations (its embedding went another way); a waiter keeps its own."""
        entry = self._entries.get(req_id)
        if entry is not None and not entry.waiting:
            del self._entries[req_id]

    def sweep(self, now: float | None = None) -> int:
        """Drop entries older than ``ttl`` that no delivery waits on; returns how many."""
        now = time.monotonic() if now is None else now
        stale = [k for k, e in self._entries.items() if not e.waiting and now - e.created >= self.ttl]
        for key in stale:
            del self._entries[key]
        return len(stale)


async def _register(table: ReceiveUrlTable, body: dict[str, Any]) -> None:
    table.register(parse_registration(body))


CONTROL_OPS = (
    ControlOp(
        name="scheduler_receive_url",
        path="/scheduler_receive_url",
        doc="zmq_to_scheduler: register where a prefill rank receives a request's embedding.",
        owner=ReceiveUrlTable,
        handler=_register,
        served_by=frozenset({TransferBackend.AUTO, TransferBackend.ZMQ_TO_SCHEDULER}),
        refusal="/scheduler_receive_url is not used by the {backend} transfer backend of this pod",
        req_id_of=lambda body: parse_registration(body).req_id,
        ok_body=True,
    ),
)
"""The control operations of receive-URL registration (zmq_to_scheduler, and auto)."""
