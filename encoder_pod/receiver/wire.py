"""The encoderpool wire format, version 1: what an encoder pushes to a prefill server over ZMQ.

One ZMQ multipart message per part of a request. Frame 0 is a msgpack map (the header); frame 1,
present only for an embedding, is the raw little-endian bytes of the contiguous ``(rows, hidden)``
tensor. An error part is frame 0 alone. No pickle: a header decodes to plain ints, strings and
lists, and every field is checked before anything is allocated. docs/wire-format.md is the spec,
with a byte-level example; this module is both its writer and its strict reader.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Sequence

import msgpack

from encoder_pod.errors import ErrorKind
from encoder_pod.modality import Modality
from encoder_pod.receiver.errors import MalformedMessage, PayloadMismatch, UnsupportedVersion

WIRE_VERSION = 1
KIND_PART = "part"
KIND_ERROR = "error"

DTYPE_SIZES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
"""dtypes an embedding may have on the wire, with their byte width."""

MAX_HEADER_BYTES = 1 << 20
MAX_REQ_ID_LEN = 512
MAX_PARTS = 4096
MAX_ITEMS = 65_536
MAX_ERROR_MSG_LEN = 65_536
PART_SUFFIX = "_local_part_"
"""SGLang's convention: part ``k`` of request ``rid`` is posted as ``<rid>_local_part_<k>``."""

BODY_PREFIX = struct.Struct(">I")
"""An HTTP body in this format (``/encode`` answering ``Accept: application/octet-stream``) is
frame 0's length as a 4-byte big-endian unsigned integer, frame 0, then frame 1."""

_COMMON = {"v", "kind", "req_id", "num_parts", "part_idx", "modality", "send_time"}
_OPTIONAL = {"encoder_idx"}
_PART = _COMMON | {"dtype", "shape", "item_tokens", "item_grids"}
_ERROR = _COMMON | {"error_kind", "error_code", "error_msg"}


@dataclass(frozen=True)
class WireHeader:
    """A validated frame-0 header."""

    req_id: str
    num_parts: int
    part_idx: int
    modality: Modality
    send_time: float
    dtype: str | None = None
    shape: tuple[int, int] | None = None
    item_tokens: tuple[int, ...] = ()
    item_grids: tuple[tuple[int, ...], ...] = ()
    error_kind: ErrorKind | None = None
    error_code: int | None = None
    error_msg: str | None = None
    encoder_idx: int | str | None = None

    @property
    def is_error(self) -> bool:
        """True for an error part (no payload frame)."""
        return self.error_kind is not None

    @property
    def payload_nbytes(self) -> int:
        """Bytes frame 1 must have (0 for an error part)."""
        if self.shape is None or self.dtype is None:
            return 0
        return self.shape[0] * self.shape[1] * DTYPE_SIZES[self.dtype]

    @property
    def request_id(self) -> str:
        """The id the parts of one request share: ``req_id`` less a ``_local_part_<part_idx>`` suffix."""
        head, sep, tail = self.req_id.rpartition(PART_SUFFIX)
        if sep and head and tail == str(self.part_idx):
            return head
        return self.req_id


# --- writing --------------------------------------------------------------------------------
def _common(req_id: str, num_parts: int, part_idx: int, modality: Modality, send_time: float, kind: str) -> dict[str, Any]:
    return {
        "v": WIRE_VERSION,
        "kind": kind,
        "req_id": req_id,
        "num_parts": num_parts,
        "part_idx": part_idx,
        "modality": modality.value,
        "send_time": float(send_time),
    }


def pack_part_header(
    *,
    req_id: str,
    num_parts: int,
    part_idx: int,
    modality: Modality,
    dtype: str,
    shape: Sequence[int],
    item_tokens: Sequence[int],
    item_grids: Sequence[Sequence[int]],
    send_time: float,
    encoder_idx: int | str | None = None,
) -> bytes:
    """Frame 0 of an embedding part."""
    header = _common(req_id, num_parts, part_idx, modality, send_time, KIND_PART)
    header.update(
        dtype=dtype,
        shape=[int(n) for n in shape],
        item_tokens=[int(n) for n in item_tokens],
        item_grids=[[int(n) for n in grid] for grid in item_grids],
    )
    if encoder_idx is not None:
        header["encoder_idx"] = encoder_idx
    return msgpack.packb(header, use_bin_type=True)


def pack_error_header(
    *,
    req_id: str,
    num_parts: int,
    part_idx: int,
    modality: Modality,
    error_kind: ErrorKind,
    error_code: int,
    error_msg: str,
    send_time: float,
    encoder_idx: int | str | None = None,
) -> bytes:
    """Frame 0 (the only frame) of an error part."""
    header = _common(req_id, num_parts, part_idx, modality, send_time, KIND_ERROR)
    header.update(error_kind=error_kind.value, error_code=int(error_code), error_msg=error_msg[:MAX_ERROR_MSG_LEN])
    if encoder_idx is not None:
        header["encoder_idx"] = encoder_idx
    return msgpack.packb(header, use_bin_type=True)


# --- reading --------------------------------------------------------------------------------
def _frame_bytes(frame: Any) -> memoryview:
    """A zmq.Frame, bytes or buffer as a memoryview (no copy)."""
    buffer = getattr(frame, "buffer", frame)
    try:
        return memoryview(buffer).cast("B")
    except TypeError:
        raise MalformedMessage(f"frame of type {type(frame).__name__} is not a byte buffer") from None


def _int(raw: dict[str, Any], key: str, lo: int, hi: int, req_id: str | None) -> int:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise MalformedMessage(f"header field {key!r} must be an integer in {lo}..{hi}, got {value!r}", req_id=req_id)
    return value


def _int_list(value: Any, key: str, req_id: str | None, limit: int = MAX_ITEMS) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > limit:
        raise MalformedMessage(f"header field {key!r} must be a list of at most {limit} integers", req_id=req_id)
    for n in value:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise MalformedMessage(f"header field {key!r} holds {n!r}, not a non-negative integer", req_id=req_id)
    return tuple(value)


def _load_map(frame: memoryview) -> dict[str, Any]:
    if len(frame) > MAX_HEADER_BYTES:
        raise MalformedMessage(f"header is {len(frame)} bytes, over the limit of {MAX_HEADER_BYTES}")
    try:
        raw = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # noqa: BLE001 - msgpack raises a zoo of types on hostile bytes
        hint = " (an SGLang pickle frame? this receiver reads the encoderpool format)" if bytes(frame[:1]) == b"\x80" else ""
        raise MalformedMessage(f"header is not msgpack ({type(exc).__name__}: {exc}){hint}") from None
    if not isinstance(raw, dict):
        raise MalformedMessage(f"header must be a msgpack map, got {type(raw).__name__}")
    return raw


def _check_keys(raw: dict[str, Any], kind: str, req_id: str | None) -> None:
    required = _PART if kind == KIND_PART else _ERROR
    missing = sorted(required - raw.keys())
    unknown = sorted(raw.keys() - required - _OPTIONAL)
    if missing or unknown:
        detail = "; ".join(x for x in (missing and f"missing {missing}", unknown and f"unknown {unknown}") if x)
        raise MalformedMessage(f"{kind} header fields: {detail}", req_id=req_id)


def _decode_common(raw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    req_id = raw.get("req_id")
    if not isinstance(req_id, str) or not 0 < len(req_id) <= MAX_REQ_ID_LEN:
        raise MalformedMessage(f"header field 'req_id' must be a string of 1..{MAX_REQ_ID_LEN} characters, got {req_id!r:.80}")
    if raw.get("v") != WIRE_VERSION:
        raise UnsupportedVersion(raw.get("v"), WIRE_VERSION, req_id=req_id)
    kind = raw.get("kind")
    if kind not in (KIND_PART, KIND_ERROR):
        raise MalformedMessage(f"header field 'kind' must be 'part' or 'error', got {kind!r:.40}", req_id=req_id)
    _check_keys(raw, kind, req_id)
    num_parts = _int(raw, "num_parts", 1, MAX_PARTS, req_id)
    part_idx = _int(raw, "part_idx", 0, num_parts - 1, req_id)
    modality = raw["modality"]
    if modality not in {m.value for m in Modality}:
        raise MalformedMessage(f"header field 'modality' must be IMAGE, AUDIO or VIDEO, got {modality!r:.40}", req_id=req_id)
    send_time = raw["send_time"]
    if isinstance(send_time, bool) or not isinstance(send_time, (int, float)) or not math.isfinite(send_time):
        raise MalformedMessage(f"header field 'send_time' must be a finite number, got {send_time!r:.40}", req_id=req_id)
    encoder_idx = raw.get("encoder_idx")
    if encoder_idx is not None and (isinstance(encoder_idx, bool) or not isinstance(encoder_idx, (int, str))):
        raise MalformedMessage("header field 'encoder_idx' must be an integer or a string", req_id=req_id)
    fields = dict(
        req_id=req_id,
        num_parts=num_parts,
        part_idx=part_idx,
        modality=Modality(modality),
        send_time=float(send_time),
        encoder_idx=encoder_idx,
    )
    return kind, fields


def _decode_part(raw: dict[str, Any], fields: dict[str, Any]) -> WireHeader:
    req_id = fields["req_id"]
    dtype = raw["dtype"]
    if dtype not in DTYPE_SIZES:
        raise MalformedMessage(f"header field 'dtype' must be one of {sorted(DTYPE_SIZES)}, got {dtype!r:.40}", req_id=req_id)
    shape = _int_list(raw["shape"], "shape", req_id, limit=2)
    if len(shape) != 2 or min(shape) < 1:
        raise MalformedMessage(f"header field 'shape' must be [rows >= 1, hidden >= 1], got {list(shape)}", req_id=req_id)
    tokens = _int_list(raw["item_tokens"], "item_tokens", req_id)
    if not tokens or sum(tokens) != shape[0]:
        raise MalformedMessage(
            f"header field 'item_tokens' {list(tokens)[:16]} must be non-empty and sum to the {shape[0]} rows", req_id=req_id
        )
    grids_raw = raw["item_grids"]
    if not isinstance(grids_raw, list) or len(grids_raw) != len(tokens):
        raise MalformedMessage(f"header field 'item_grids' must be a list of {len(tokens)} lists (one per item)", req_id=req_id)
    grids = tuple(_int_list(g, "item_grids", req_id, limit=8) for g in grids_raw)
    return WireHeader(dtype=dtype, shape=(shape[0], shape[1]), item_tokens=tokens, item_grids=grids, **fields)


def _decode_error(raw: dict[str, Any], fields: dict[str, Any]) -> WireHeader:
    req_id = fields["req_id"]
    try:
        kind = ErrorKind(raw["error_kind"])
    except (ValueError, TypeError):
        raise MalformedMessage(f"header field 'error_kind' {raw['error_kind']!r:.40} is not a known error kind", req_id=req_id) from None
    code = _int(raw, "error_code", 400, 599, req_id)
    msg = raw["error_msg"]
    if not isinstance(msg, str) or len(msg) > MAX_ERROR_MSG_LEN:
        raise MalformedMessage(f"header field 'error_msg' must be a string of at most {MAX_ERROR_MSG_LEN} characters", req_id=req_id)
    return WireHeader(error_kind=kind, error_code=code, error_msg=msg, **fields)


def decode_header(frame: Any) -> WireHeader:
    """Frame 0 -> :class:`WireHeader`; raises :class:`MalformedMessage` (or a subclass) on anything off."""
    return decode_fields(_load_map(_frame_bytes(frame)))


def decode_fields(raw: dict[str, Any]) -> WireHeader:
    """A header map decoded by some other means (an inline answer's fields) -> :class:`WireHeader`, checked as frame 0 is."""
    kind, fields = _decode_common(raw)
    return _decode_part(raw, fields) if kind == KIND_PART else _decode_error(raw, fields)


def split_body(body: Any) -> list[memoryview]:
    """An HTTP body of this format -> its frames (views, no copy), for :func:`decode_message`."""
    view = _frame_bytes(body)
    if len(view) < BODY_PREFIX.size:
        raise MalformedMessage(f"body of {len(view)} bytes has no frame-0 length")
    (size,) = BODY_PREFIX.unpack_from(view)
    if size > MAX_HEADER_BYTES or BODY_PREFIX.size + size > len(view):
        raise MalformedMessage(f"frame-0 length {size} does not fit a body of {len(view)} bytes")
    start = BODY_PREFIX.size + size
    frames = [view[BODY_PREFIX.size : start]]
    if start < len(view):
        frames.append(view[start:])
    return frames


def decode_message(frames: Sequence[Any]) -> tuple[WireHeader, memoryview | None]:
    """A whole multipart message -> (header, payload view or None for an error part).

    The payload is a view of the received frame: copy it before the frame goes away.
    """
    if not frames:
        raise MalformedMessage("empty message")
    header = decode_header(frames[0])
    expected = 1 if header.is_error else 2
    if len(frames) != expected:
        raise MalformedMessage(
            f"{'an error' if header.is_error else 'a part'} message has {expected} frame(s), got {len(frames)}",
            req_id=header.req_id,
        )
    if header.is_error:
        return header, None
    payload = _frame_bytes(frames[1])
    if len(payload) != header.payload_nbytes:
        raise PayloadMismatch(
            f"payload is {len(payload)} bytes but dtype {header.dtype} and shape {list(header.shape or ())} "
            f"need {header.payload_nbytes}",
            req_id=header.req_id,
        )
    return header, payload
