"""SGLang's ``mooncake`` backend: the prefill ranks pull sizes, then ask for a write into their memory.

The flow (the same in SGLang 0.5.19 .. 0.5.23, ``WaitingRDMARequest`` on the prefill side):

1. The tokenizer POSTs ``/encode`` with ``embedding_port: null``. The pod encodes, stages the
   embedding here and answers ``null`` (SGLang's own encoder answers with the sizes; its receiver
   reads only the status).
2. Every prefill TP rank POSTs ``/scheduler_receive_meta_data`` ``{req_id, part_idx}``, possibly
   before ``/encode`` arrives: it waits until the sizes are known, then gets
   ``{req_id, part_idx, embedding_size, embedding_len, embedding_dim}`` (bytes, rows, width).
3. Each rank allocates one landing buffer for all parts and POSTs ``/send`` per part with the
   sizes plus ``prefill_host, embedding_port, session_id, buffer_address, receive_count``. The pod
   writes the bytes with mooncake into ``buffer_address`` of that session, then pushes the
   one-frame acknowledgement (SGLang's pickled ``EmbeddingData`` without a tensor) to
   ``tcp://prefill_host:embedding_port``; the rank assembles once every part is acknowledged.
4. The staged embedding is released once ``receive_count`` distinct ranks (``host:port``) got
   their copy, or ``SEND_TIMEOUT`` after it was staged.

The receiver views the landing buffer in ITS model dtype, so the pod's ``DTYPE`` must be the
prefill model's. A failed encode is published instead of sizes: the waiting pulls get its status
and message. Everything lives on the event loop that serves the routes.

Both routes are declared here, once (:data:`CONTROL_OPS`): auto and mooncake serve them. This
module imports no torch (the front and the HTTP edge read the declarations).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from encoder_pod.errors import DuplicateRequest, EncoderError, InvalidRequest, Overloaded, RequestTimeout, TransferFailed
from encoder_pod.protocol import MAX_REQ_ID_LEN, EncodeRequest
from encoder_pod.settings import TransferBackend
from encoder_pod.transfer.control import ControlOp
from encoder_pod.transfer.mooncake_engine import MooncakeEngine
from encoder_pod.transfer.push_sender import PushSender, endpoint

if TYPE_CHECKING:  # both import torch; the staging only handles their instances
    from encoder_pod.models.base import EncodedPart
    from encoder_pod.transfer.sglang_frames import SglangCodec


@dataclass
class _Staged:
    created: float
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    claimed: asyncio.Event = field(default_factory=asyncio.Event)
    request: EncodeRequest | None = None
    part: EncodedPart | None = None
    error: EncoderError | None = None
    registered: bool = False
    sent_to: set[str] = field(default_factory=set)


def sizes(part: EncodedPart) -> dict[str, int]:
    """``embedding_size`` (bytes), ``embedding_len`` (rows), ``embedding_dim`` (width) of a part."""
    emb = part.embedding
    return {"embedding_size": emb.numel() * emb.element_size(), "embedding_len": int(emb.shape[0]), "embedding_dim": int(emb.shape[1])}


def _field(body: dict[str, Any], name: str, kind: type, req_id: str | None) -> Any:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise InvalidRequest(f"field '{name}': required, {kind.__name__}, got {value!r:.60}", req_id=req_id)
    return value


def _req_id(body: dict[str, Any]) -> str:
    req_id = body.get("req_id")
    if not isinstance(req_id, str) or not 0 < len(req_id) <= MAX_REQ_ID_LEN:
        raise InvalidRequest(f"field 'req_id': required, a string of 1..{MAX_REQ_ID_LEN} characters")
    return req_id


class MooncakeStaging:
    """Staged embeddings by part req_id, served to the prefill ranks' pulls (bounded, expiring)."""

    def __init__(self, engine: MooncakeEngine, sender: PushSender, codec: SglangCodec, *, ttl: float, max_entries: int) -> None:
        self.engine = engine
        self._sender = sender
        self._codec = codec
        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: dict[str, _Staged] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def _entry(self, req_id: str, *, create: bool) -> _Staged | None:
        self.sweep()
        entry = self._entries.get(req_id)
        if entry is None and create:
            if len(self._entries) >= self.max_entries:
                raise Overloaded(f"{self.max_entries} mooncake transfers pending (ENCODER_MAX_QUEUE); retry later", req_id=req_id)
            entry = self._entries[req_id] = _Staged(time.monotonic())
        return entry

    # --- the encoder side -----------------------------------------------------------------------
    def stage(self, request: EncodeRequest, part: EncodedPart) -> None:
        """Hold ``part`` for the ranks' ``/send`` (and wake the pulls waiting for its sizes)."""
        entry = self._entry(request.req_id, create=True)
        assert entry is not None
        if entry.part is not None or entry.error is not None:
            raise DuplicateRequest(f"req_id {request.req_id!r} already has a staged mooncake embedding", req_id=request.req_id)
        if part.embedding.shape[0] == 0:
            raise TransferFailed("SGLang's mooncake receiver cannot take a zero-row embedding", req_id=request.req_id)
        entry.request, entry.part = request, part
        entry.ready.set()

    def stage_error(self, request: EncodeRequest, error: EncoderError) -> None:
        """Publish a failed encode: waiting and later pulls for this part get its status and message."""
        try:
            entry = self._entry(request.req_id, create=True)
        except Overloaded:
            return  # nobody can be waiting on an entry that was never made
        assert entry is not None
        if entry.part is None:
            entry.request, entry.error = request, error
            entry.ready.set()

    def discard(self, req_id: str) -> None:
        """Drop a staged part (its embedding went another way)."""
        entry = self._entries.pop(req_id, None)
        if entry is not None:
            self._release(entry)

    async def claimed(self, req_id: str, timeout: float) -> None:
        """Return once a prefill rank pulled this part's metadata (it receives through mooncake)."""
        entry = self._entry(req_id, create=True)
        assert entry is not None
        await asyncio.wait_for(entry.claimed.wait(), max(timeout, 0))

    # --- the prefill ranks' routes --------------------------------------------------------------
    async def meta(self, body: dict[str, Any]) -> dict[str, Any]:
        """``/scheduler_receive_meta_data``: the part's sizes once encoded (waits up to SEND_TIMEOUT)."""
        req_id = _req_id(body)
        part_idx = body.get("part_idx")
        entry = self._entry(req_id, create=True)
        assert entry is not None
        entry.claimed.set()
        await asyncio.to_thread(self.engine.start)  # a pod that cannot write says so before the rank allocates
        try:
            await asyncio.wait_for(entry.ready.wait(), self.ttl)
        except TimeoutError:
            raise RequestTimeout(f"encode metadata not ready within {self.ttl:g}s (ENCODER_SEND_TIMEOUT)", req_id=req_id) from None
        if entry.error is not None:
            raise EncoderError.from_kind(entry.error.kind, entry.error.message, req_id)
        assert entry.part is not None
        return {"req_id": req_id, "part_idx": part_idx, **sizes(entry.part)}

    async def send(self, body: dict[str, Any]) -> None:
        """``/send``: write the staged part into the rank's buffer, then acknowledge it over ZMQ."""
        req_id = _req_id(body)
        entry = self._entries.get(req_id)
        if entry is None or not entry.ready.is_set():
            raise TransferFailed(f"no staged embedding for req_id={req_id} (already released, or never encoded here)", req_id=req_id)
        if entry.error is not None:
            raise EncoderError.from_kind(entry.error.kind, entry.error.message, req_id)
        assert entry.part is not None and entry.request is not None
        host = _field(body, "prefill_host", str, req_id)
        port = _field(body, "embedding_port", int, req_id)
        session = _field(body, "session_id", str, req_id)
        address = _field(body, "buffer_address", int, req_id)
        count = body.get("receive_count")
        want = sizes(entry.part)["embedding_size"]
        if body.get("embedding_size", want) != want:
            raise InvalidRequest(f"field 'embedding_size': {body.get('embedding_size')!r} is not this part's {want} bytes", req_id=req_id)
        tensor = entry.part.embedding
        if not entry.registered:
            # On the loop, not in a thread: no await between the check and the mark (ranks send concurrently).
            self.engine.register(tensor.data_ptr(), want)
            entry.registered = True
        await asyncio.to_thread(self.engine.write, session, tensor.data_ptr(), address, want)
        ack = [self._codec.header(entry.request, entry.part)]
        await self._sender.send(endpoint(host, port), ack, max(self.ttl - (time.monotonic() - entry.created), 1.0))
        entry.sent_to.add(f"{host}:{port}")
        if isinstance(count, int) and not isinstance(count, bool) and len(entry.sent_to) >= count:
            self.discard(req_id)  # every rank has its copy

    # --- housekeeping ---------------------------------------------------------------------------
    def _release(self, entry: _Staged) -> None:
        if entry.registered and entry.part is not None:
            self.engine.unregister(entry.part.embedding.data_ptr())
        entry.registered = False
        entry.part = None

    def sweep(self, now: float | None = None) -> int:
        """Release parts staged longer than SEND_TIMEOUT ago (a rank that never sent); returns how many."""
        now = time.monotonic() if now is None else now
        stale = [k for k, e in self._entries.items() if now - e.created >= self.ttl]
        for key in stale:
            self._release(self._entries.pop(key))
        return len(stale)

    def close(self) -> None:
        """Release everything still staged."""
        for key in list(self._entries):
            self._release(self._entries.pop(key))


def _refusal(path: str) -> str:
    return f"{path} is mooncake's; this pod's transfer backend is {{backend}} (ENCODER_TRANSFER_BACKEND=auto or mooncake serves it)"


_SERVED_BY = frozenset({TransferBackend.AUTO, TransferBackend.MOONCAKE})

CONTROL_OPS = (
    ControlOp(
        name="scheduler_receive_meta_data",
        path="/scheduler_receive_meta_data",
        doc="mooncake: a prefill rank pulls a part's sizes (waits until the part is encoded).",
        owner=MooncakeStaging,
        handler=MooncakeStaging.meta,
        served_by=_SERVED_BY,
        refusal=_refusal("/scheduler_receive_meta_data"),
    ),
    ControlOp(
        name="send",
        path="/send",
        doc="mooncake: write a staged part into a prefill rank's buffer, then acknowledge it over ZMQ.",
        owner=MooncakeStaging,
        handler=MooncakeStaging.send,
        served_by=_SERVED_BY,
        refusal=_refusal("/send"),
        answer_model=None,  # SGLang's rank reads only the status
    ),
)
"""mooncake's control operations: the ranks' sizes pull and their write request."""
