"""Merging the parts of a request into one embedding: pure state, no sockets, no clock of its own.

The sockets (sync and async) feed messages in and ask for expiries; this module decides what a
message means. It is strict: a part that cannot be decoded, that disagrees with its siblings or
that comes twice fails its request with a typed error; a message with no usable request id is
rejected on its own; neither ever raises out of :meth:`Assembler.feed`.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence, Union

import torch

from encoder_pod.modality import Modality
from encoder_pod.receiver.errors import (
    InconsistentParts,
    MalformedMessage,
    ReceiverError,
    RemoteEncodeError,
    RequestExpired,
)
from encoder_pod.receiver.wire import PART_SUFFIX, WireHeader, decode_message

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModalityEmbedding:
    """Every part of one modality, concatenated in ``part_idx`` order."""

    modality: Modality
    embedding: torch.Tensor
    item_tokens: tuple[int, ...]
    item_grids: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class ReceivedEmbedding:
    """A complete request: its parts in ``part_idx`` order, merged per modality."""

    request_id: str
    parts: tuple[WireHeader, ...]
    modalities: dict[Modality, ModalityEmbedding]

    @property
    def num_parts(self) -> int:
        """How many parts made this request."""
        return len(self.parts)

    def embedding(self, modality: Modality | None = None) -> torch.Tensor:
        """The merged embedding of ``modality`` (may be omitted when the request has one modality)."""
        if modality is None:
            if len(self.modalities) != 1:
                raise KeyError(f"request has modalities {[m.value for m in self.modalities]}: name one")
            return next(iter(self.modalities.values())).embedding
        return self.modalities[modality].embedding


@dataclass(frozen=True)
class Completed:
    """Every part of a request arrived."""

    result: ReceivedEmbedding

    @property
    def request_id(self) -> str:
        """The request that completed."""
        return self.result.request_id


@dataclass(frozen=True)
class Failed:
    """A request ended in an error: an error part, a bad part, or expiry."""

    request_id: str
    error: ReceiverError


@dataclass(frozen=True)
class Rejected:
    """A message that names no usable request (garbage, no req_id); nobody waits for it."""

    error: MalformedMessage


Outcome = Union[Completed, Failed, Rejected]


@dataclass
class _Pending:
    num_parts: int
    first_seen: float
    parts: dict[int, tuple[WireHeader, torch.Tensor]] = field(default_factory=dict)


def _group_of(req_id: str) -> str:
    """Request id of a part id when only the raw id is known (a part that failed to decode)."""
    head, sep, tail = req_id.rpartition(PART_SUFFIX)
    return head if sep and head and tail.isdigit() else req_id


def _to_tensor(header: WireHeader, payload: memoryview) -> torch.Tensor:
    # One copy out of the ZMQ frame, into memory this tensor owns (the frame is reused after recv;
    # a bytearray is writable, so torch has no reason to warn).
    dtype = getattr(torch, header.dtype or "")
    assert header.shape is not None
    return torch.frombuffer(bytearray(payload), dtype=dtype).reshape(header.shape)


def merge_parts(request_id: str, parts: Sequence[tuple[WireHeader, torch.Tensor]]) -> ReceivedEmbedding:
    """Concatenate parts (already in ``part_idx`` order) per modality; raise on disagreeing parts."""
    groups: dict[Modality, list[tuple[WireHeader, torch.Tensor]]] = {}
    for header, tensor in parts:
        groups.setdefault(header.modality, []).append((header, tensor))
    merged: dict[Modality, ModalityEmbedding] = {}
    for modality, group in groups.items():
        first = group[0][1]
        for header, tensor in group[1:]:
            if tensor.dtype != first.dtype or tensor.shape[1] != first.shape[1]:
                raise InconsistentParts(
                    f"{modality.value} part {header.part_idx} is {header.dtype} x {tensor.shape[1]} but part "
                    f"{group[0][0].part_idx} is {group[0][0].dtype} x {first.shape[1]}",
                    req_id=request_id,
                )
        merged[modality] = ModalityEmbedding(
            modality=modality,
            embedding=torch.cat([t for _, t in group]) if len(group) > 1 else first,
            item_tokens=tuple(n for h, _ in group for n in h.item_tokens),
            item_grids=tuple(g for h, _ in group for g in h.item_grids),
        )
    return ReceivedEmbedding(request_id, tuple(h for h, _ in parts), merged)


class Assembler:
    """Tracks partial requests; :meth:`feed` turns one message into at most one outcome."""

    def __init__(self, *, expire_after: float = 180.0, max_pending: int = 1024) -> None:
        self.expire_after = expire_after
        self.max_pending = max_pending
        self._pending: dict[str, _Pending] = {}
        # Requests that ended recently: a late part for one of them is stale, not a new request.
        self._finished: OrderedDict[str, float] = OrderedDict()

    @property
    def pending(self) -> int:
        """Requests with some but not all parts."""
        return len(self._pending)

    def feed(self, frames: Sequence[Any], now: float) -> Outcome | None:
        """Account one received message; return what it completed or failed (None: still waiting)."""
        try:
            header, payload = decode_message(frames)
        except MalformedMessage as err:
            if err.req_id is None:
                return Rejected(err)
            return self._fail(_group_of(err.req_id), err, now)
        request_id = header.request_id
        if request_id in self._finished:
            log.warning("dropping a late part %d of finished request %r", header.part_idx, request_id)
            return None
        if header.is_error:
            assert header.error_kind is not None
            remote = RemoteEncodeError.from_kind(
                f"encoder failed part {header.part_idx}/{header.num_parts}: {header.error_msg}",
                req_id=request_id,
                kind=header.error_kind,
                part_idx=header.part_idx,
            )
            remote.status = header.error_code or remote.status
            return self._fail(request_id, remote, now)
        assert payload is not None
        return self._add_part(request_id, header, _to_tensor(header, payload), now)

    def _add_part(self, request_id: str, header: WireHeader, tensor: torch.Tensor, now: float) -> Outcome | None:
        entry = self._pending.get(request_id)
        if entry is None:
            if len(self._pending) >= self.max_pending:
                return self._fail(
                    request_id,
                    ReceiverError(f"{self.max_pending} requests already pending; refusing a new one", req_id=request_id),
                    now,
                )
            entry = self._pending[request_id] = _Pending(header.num_parts, now)
        if header.num_parts != entry.num_parts:
            return self._fail(
                request_id,
                InconsistentParts(f"part {header.part_idx} says {header.num_parts} parts, earlier parts said {entry.num_parts}", req_id=request_id),
                now,
            )
        if header.part_idx in entry.parts:
            return self._fail(request_id, InconsistentParts(f"part {header.part_idx} arrived twice", req_id=request_id), now)
        entry.parts[header.part_idx] = (header, tensor)
        if len(entry.parts) < entry.num_parts:
            return None
        del self._pending[request_id]
        self._mark_finished(request_id, now)
        try:
            return Completed(merge_parts(request_id, [entry.parts[i] for i in range(entry.num_parts)]))
        except ReceiverError as err:
            return Failed(request_id, err)

    def _fail(self, request_id: str, error: ReceiverError, now: float) -> Failed:
        self._pending.pop(request_id, None)
        self._mark_finished(request_id, now)
        return Failed(request_id, error)

    def _mark_finished(self, request_id: str, now: float) -> None:
        self._finished[request_id] = now
        self._finished.move_to_end(request_id)
        while len(self._finished) > 4 * self.max_pending:
            self._finished.popitem(last=False)

    def expire(self, now: float) -> list[Failed]:
        """Fail every request older than ``expire_after``; forget finished ids as old."""
        out: list[Failed] = []
        for request_id, entry in list(self._pending.items()):
            if now - entry.first_seen >= self.expire_after:
                error = RequestExpired(request_id, len(entry.parts), entry.num_parts, self.expire_after)
                out.append(self._fail(request_id, error, now))
        while self._finished and now - next(iter(self._finished.values())) >= self.expire_after:
            self._finished.popitem(last=False)
        return out

    def next_expiry(self) -> float | None:
        """When the oldest pending request expires (None: nothing pending)."""
        if not self._pending:
            return None
        return min(e.first_seen for e in self._pending.values()) + self.expire_after
