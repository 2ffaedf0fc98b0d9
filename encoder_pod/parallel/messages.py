"""The typed messages between the data-parallel front and its workers.

A message is a ZMQ multipart: frame 0 is a msgpack map ``{"v": WIRE_VERSION, "k": kind, ...fields}``
of one of the structs below; any further frames are raw bytes that msgpack never copies into a
map: an :class:`Encode`'s item sources (frame i+1 is item i, UTF-8), a :class:`Result`'s inline
embedding (frame 1, the :class:`~encoder_pod.transfer.inline.InlineAnswer`'s raw tensor bytes; the
front renders them as the caller asked). Nothing here is pickled: both ends only ever build the
struct named by the kind, so a bad frame is a :class:`ProtocolError`, never code execution.

A worker's metrics travel typed too: its registry's collected families as :class:`MetricFamily`
tuples (name, type, help, samples with their labels and values), which the front exposes through
a collector that adds the ``rank`` label (``parallel.ranked_metrics``); no Prometheus text is
parsed or rewritten anywhere.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass
from enum import Enum, IntEnum
from typing import Any, Callable, ClassVar, NamedTuple, Sequence

import msgpack

from encoder_pod.errors import EncoderError, ErrorKind, InternalError
from encoder_pod.facts import ReplicaReport
from encoder_pod.modality import Modality
from encoder_pod.protocol import EncodeRequest, ItemSpec
from encoder_pod.readiness import LoadStep, ReplicaState
from encoder_pod.transfer.registry import CONTROL_OPS

Frame = bytes | bytearray | memoryview
"""One raw frame of a multipart message."""

WIRE_VERSION = 8
"""Bumped on any change of a struct; both ends are one install, so a mismatch is a bug."""


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, as plain values (the spawn argument is its JSON)."""

    rank: int
    generation: int
    inbox: str
    results: str
    settings_json: str
    env: dict[str, str]

    def to_json(self) -> str:
        """The spawn argument."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "WorkerSpec":
        """Inverse of :meth:`to_json`."""
        return cls(**json.loads(text))


class ProtocolError(InternalError):
    """A frame that is not a message of this version (500 if it ever reaches a caller)."""


class MsgKind(IntEnum):
    """Every message kind; front -> worker below 20, worker -> front from 20."""

    ENCODE = 1
    CANCEL = 2
    CALL = 3
    STOP = 5
    STATUS = 20
    RESULT = 21
    ERROR = 22


START_PROFILE = "start_profile"
"""The :class:`Call` op that starts a worker's profiler (fanned out to every rank by the front)."""
STOP_PROFILE = "stop_profile"
"""The :class:`Call` op that stops it."""


def _op_name(value: Any) -> str:
    """A :class:`Call`'s op: profiling's, or a registered transfer operation's name."""
    if value not in (START_PROFILE, STOP_PROFILE) and value not in {op.name for op in CONTROL_OPS}:
        raise ValueError(f"unknown control operation {value!r:.80}")
    return str(value)


@dataclass(frozen=True)
class Encode:
    """Front -> worker: run one validated /encode request (fields and item frames: :func:`request_to_wire`)."""

    KIND: ClassVar[MsgKind] = MsgKind.ENCODE
    call_id: int
    request: dict[str, Any]


@dataclass(frozen=True)
class Cancel:
    """Front -> worker: the caller of ``call_id`` is gone or timed out; drop its work."""

    KIND: ClassVar[MsgKind] = MsgKind.CANCEL
    call_id: int


@dataclass(frozen=True)
class Call:
    """Front -> worker: a control operation by name, answered by a :class:`Result` or :class:`Error`:
    :data:`START_PROFILE`, :data:`STOP_PROFILE`, or a transfer backend's operation
    (:mod:`encoder_pod.transfer.registry`); any other name is a ProtocolError when decoded."""

    KIND: ClassVar[MsgKind] = MsgKind.CALL
    _DECODE: ClassVar[dict[str, Callable[[Any], Any]]] = {"op": _op_name}
    call_id: int
    op: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Stop:
    """Front -> worker: finish started batches within ``grace_s``, then exit."""

    KIND: ClassVar[MsgKind] = MsgKind.STOP
    grace_s: float


METRIC_TYPES = frozenset({"counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown", "info", "stateset"})
"""The family types prometheus_client collects (``prometheus_client.metrics_core.METRIC_TYPES``)."""


class MetricSample(NamedTuple):
    """One sample of a :class:`MetricFamily`: the sample's name is the family's plus ``suffix``."""

    suffix: str
    """``""`` (a gauge), ``"_total"``, ``"_bucket"``, ``"_sum"``, ``"_count"``, ``"_created"`` ..."""
    labels: dict[str, str]
    value: float


class MetricFamily(NamedTuple):
    """One collected metric family of a worker's registry, as ``registry.collect()`` gives it."""

    name: str
    """The family's name without the counter's ``_total`` (OpenMetrics naming, as collected)."""
    type: str
    help: str
    unit: str
    samples: tuple[MetricSample, ...]


def families_from_wire(raw: Any) -> tuple[MetricFamily, ...]:
    """The :class:`MetricFamily` tuples of a :class:`Status`'s ``metrics`` field (msgpack gives lists)."""
    families = []
    for name, typ, help_, unit, samples in raw:
        if not (isinstance(name, str) and isinstance(help_, str) and isinstance(unit, str)) or typ not in METRIC_TYPES:
            raise ValueError(f"malformed metric family {name!r} of type {typ!r}")
        out = []
        for suffix, labels, value in samples:
            if not isinstance(suffix, str) or not isinstance(labels, dict) or not isinstance(value, (int, float)):
                raise ValueError(f"malformed sample of metric family {name!r}")
            out.append(MetricSample(suffix, labels, value))
        families.append(MetricFamily(name, typ, help_, unit, tuple(out)))
    return tuple(families)


@dataclass(frozen=True)
class Status:
    """Worker -> front: a heartbeat with the worker's state, load progress, report and metrics."""

    KIND: ClassVar[MsgKind] = MsgKind.STATUS
    _DECODE: ClassVar[dict[str, Callable[[Any], Any]]] = {
        "state": ReplicaState, "step": LoadStep, "report": ReplicaReport.from_wire, "metrics": families_from_wire,
    }
    _ENCODE: ClassVar[dict[str, Callable[[Any], Any]]] = {"report": ReplicaReport.to_wire}
    rank: int
    generation: int
    pid: int
    state: ReplicaState
    step: LoadStep | None
    """What a LOADING replica is doing (None otherwise)."""
    elapsed_s: float
    error: str | None = None
    report: ReplicaReport | None = None
    """What the replica reports of itself (None until its runtime exists)."""
    metrics: tuple[MetricFamily, ...] | None = None
    """Every family of the replica's registry, collected at this heartbeat."""
    healthy: bool = False
    """The replica's readiness verdict: what /health says for this rank."""
    health_error: str | None = None
    """Why it is not ready (None when healthy)."""
    stalled: bool = False
    """A rank of its tensor-parallel group stopped sending heartbeats: route nothing new here."""
    refused: bool = False
    """The load failed because this pod cannot serve the checkpoint (``error`` says why): every
    start would fail the same way, so the front gives the rank up at once instead of retrying."""


@dataclass(frozen=True)
class Result:
    """Worker -> front: the answer to ``call_id``.

    A control call's answer is ``body``; an /encode's is ``inline`` (the inline answer's metadata,
    its data in frame 1) or neither (pushed to prefill: the HTTP answer is ``null``).
    """

    KIND: ClassVar[MsgKind] = MsgKind.RESULT
    rank: int
    generation: int
    call_id: int
    body: Any = None
    inline: dict[str, Any] | None = None


@dataclass(frozen=True)
class Error:
    """Worker -> front: ``call_id`` failed; the kind and HTTP code survive the process boundary."""

    KIND: ClassVar[MsgKind] = MsgKind.ERROR
    _DECODE: ClassVar[dict[str, Callable[[Any], Any]]] = {"kind": ErrorKind}
    rank: int
    generation: int
    call_id: int
    kind: ErrorKind
    http_status: int
    message: str
    req_id: str | None = None

    @classmethod
    def of(cls, rank: int, generation: int, call_id: int, err: EncoderError) -> "Error":
        """The message for a typed error raised in the worker."""
        return cls(rank, generation, call_id, err.kind, err.http_status, err.message, err.req_id)

    def to_exception(self) -> EncoderError:
        """The same typed error, rebuilt on the front's side of the boundary."""
        return EncoderError.from_kind(self.kind, self.message, self.req_id)


Message = Encode | Cancel | Call | Stop | Status | Result | Error
_STRUCTS: dict[MsgKind, type[Any]] = {
    cls.KIND: cls for cls in (Encode, Cancel, Call, Stop, Status, Result, Error)
}


def pack(msg: Message, *frames: Frame) -> list[Frame]:
    """The multipart frames of ``msg`` followed by raw ``frames``."""
    fields: dict[str, Any] = {"v": WIRE_VERSION, "k": int(msg.KIND)}
    encoders = getattr(msg, "_ENCODE", {})
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        if value is not None and f.name in encoders:
            value = encoders[f.name](value)
        fields[f.name] = value.value if isinstance(value, Enum) else value
    return [msgpack.packb(fields, use_bin_type=True), *frames]


def unpack(frames: Sequence[Frame]) -> tuple[Message, list[Frame]]:
    """The struct in frame 0 and the raw frames after it; :class:`ProtocolError` if malformed."""
    if not frames:
        raise ProtocolError("empty message")
    try:
        fields = msgpack.unpackb(frames[0], raw=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"undecodable message header: {exc}") from None
    if not isinstance(fields, dict):
        raise ProtocolError("message header is not a map")
    if fields.get("v") != WIRE_VERSION:
        raise ProtocolError(f"message version {fields.get('v')!r}, this end speaks {WIRE_VERSION}")
    try:
        cls = _STRUCTS[MsgKind(fields["k"])]
    except (ValueError, KeyError, TypeError):
        raise ProtocolError(f"unknown message kind {fields.get('k')!r}") from None
    decoders = getattr(cls, "_DECODE", {})
    values: dict[str, Any] = {}
    try:
        for f in dataclasses.fields(cls):
            if f.name not in fields:
                if f.default is dataclasses.MISSING:
                    raise ProtocolError(f"{cls.__name__} without field {f.name!r}")
                continue
            raw = fields[f.name]
            values[f.name] = decoders[f.name](raw) if f.name in decoders and raw is not None else raw
    except (ValueError, TypeError, KeyError) as exc:
        raise ProtocolError(f"{cls.__name__}: {exc}") from None
    return cls(**values), list(frames[1:])


def request_to_wire(request: EncodeRequest) -> tuple[dict[str, Any], list[bytes]]:
    """A validated request as plain msgpack fields, and each item's source as a raw frame.

    The worker does not parse the body again; a multi-megabyte data: URI is one frame, never
    packed into (or copied out of) a msgpack map.
    """
    port = request.embedding_port
    fields = {
        "req_id": request.req_id,
        "modality": request.modality.value,
        "item_options": [spec.options for spec in request.items],
        "item_hashes": [spec.content_hash for spec in request.items],
        "num_parts": request.num_parts,
        "part_idx": request.part_idx,
        "prefill_host": request.prefill_host,
        "embedding_port": list(port) if isinstance(port, tuple) else port,
        "encoder_idx": request.encoder_idx,
        "hashes": list(request.hashes) if request.hashes is not None else None,
    }
    # surrogatepass: JSON may carry lone surrogates ("\ud800"); they survive the round trip.
    return fields, [spec.source.encode("utf-8", "surrogatepass") for spec in request.items]


def encode_frames(call_id: int, request: EncodeRequest) -> list[Frame]:
    """The frames of an :class:`Encode` (CPU work for a large request: call it on a thread).

    Raises TypeError, ValueError or OverflowError for a value msgpack cannot carry.
    """
    fields, sources = request_to_wire(request)
    return pack(Encode(call_id, fields), *sources)


def request_from_wire(fields: dict[str, Any], frames: Sequence[Frame]) -> EncodeRequest:
    """Inverse of :func:`request_to_wire`."""
    try:
        port = fields["embedding_port"]
        options = fields["item_options"]
        if len(options) != len(frames):
            raise ValueError(f"{len(options)} items but {len(frames)} item frames")
        hashes = fields.get("item_hashes") or [None] * len(options)
        items = tuple(
            ItemSpec(bytes(frame).decode("utf-8", "surrogatepass"), dict(opts), digest)
            for frame, opts, digest in zip(frames, options, hashes)
        )
        return EncodeRequest(
            req_id=fields["req_id"],
            modality=Modality(fields["modality"]),
            items=items,
            num_parts=fields["num_parts"],
            part_idx=fields["part_idx"],
            prefill_host=fields["prefill_host"],
            embedding_port=tuple(port) if isinstance(port, list) else port,
            encoder_idx=fields["encoder_idx"],
            hashes=tuple(fields["hashes"]) if fields["hashes"] is not None else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed request on the wire: {exc!r}") from None
