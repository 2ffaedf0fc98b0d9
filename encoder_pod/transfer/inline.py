"""The ``inline`` backend: the embedding comes back in the /encode response, in the format asked for.

For clients that are not prefill servers (tests, batch jobs, other frameworks). Three renderings
of one answer, chosen by the request's ``Accept`` header (:mod:`encoder_pod.api.answers`):

- **JSON** (the default, what curl gets): ``{"status": "ok", "req_id", ..., "embedding":
  {"dtype", "shape", "encoding": "base64", "data"}, "item_token_counts", "item_grids"}``;
  ``data`` is base64 of the tensor's little-endian bytes (bf16 as raw 16-bit words).
- **binary** (``application/octet-stream``): the project's wire format (docs/wire-format.md) in
  one body: frame 0's length (4 bytes, big-endian), frame 0 (the msgpack part header a push
  carries), frame 1 (the raw tensor bytes).
- **msgpack** (``application/x-msgpack``): the JSON body's fields as one msgpack map, the
  embedding last, its ``data`` a msgpack ``bin`` of the raw bytes (``encoding: "raw"``).

This module alone builds and renders those bodies. In between it is an :class:`InlineAnswer`: the
body's small fields (``meta``) and the raw tensor bytes (``data``, a view of the tensor), which
cross the data-parallel boundary as a frame of their own and are never copied into a JSON or
msgpack value. Only the JSON rendering is CPU work (base64, with pybase64): a large one runs on
a thread, in slices of about a megabyte, so the thread gives the GIL back between them and the
loop that waits stays responsive (a multi-megabyte answer never stalls ``/health``); a small one
is rendered on the loop (``encoder_pod.api.answers.LOOP_JSON_BYTES``). The binary renderings pack
a small header and hand the tensor's memory on as it is.
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
import orjson
import pybase64

from encoder_pod.errors import InvalidRequest
from encoder_pod.protocol import EncodeRequest

if TYPE_CHECKING:
    from encoder_pod.models.base import EncodedPart

BASE64_SLICE = 3 * 256 * 1024
"""Bytes encoded per step (a multiple of 3, so the slices' base64 concatenates exactly)."""

PIECE = 1 << 20
"""Bytes of the rendered body per piece handed to the HTTP server."""

Buffer = bytes | bytearray | memoryview

_BIN32 = struct.Struct(">BI")
"""msgpack's bin 32 header (0xc6, length): the raw bytes follow it in the body unchanged."""

_FRAME0_LENGTH = struct.Struct(">I")
WIRE_DTYPES = ("float32", "float16", "bfloat16", "float64")
"""dtypes the wire format carries (``encoder_pod.receiver.wire.DTYPE_SIZES``)."""


def _json(value: Any) -> bytes:
    """Compact JSON, as the standard library writes it with ``ensure_ascii=False`` for these values."""
    try:
        return orjson.dumps(value)
    except TypeError:  # an integer beyond 64 bits (an echoed encoder_idx): the standard library writes it
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def base64_of(view: memoryview) -> bytearray:
    """Base64 of ``view``, encoded slice by slice into one preallocated buffer."""
    out = bytearray(4 * ((len(view) + 2) // 3))
    for start in range(0, len(view), BASE64_SLICE):
        encoded = pybase64.b64encode(view[start : start + BASE64_SLICE])
        at = start // 3 * 4
        out[at : at + len(encoded)] = encoded
    return out


def _pieces(data: Buffer) -> list[memoryview]:
    view = memoryview(data).cast("B")
    return [view[at : at + PIECE] for at in range(0, len(view), PIECE)]


def _wire_idx(value: Any) -> int | str | None:
    """``encoder_idx`` as the wire format carries it (an int or a string; anything else is left out)."""
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class InlineAnswer:
    """A successful inline answer: the body's fields and the embedding's raw bytes, apart."""

    meta: dict[str, Any]
    """The body's fields (key order is the JSON body's); ``embedding`` holds only ``dtype`` and ``shape``."""
    data: Buffer
    """The embedding's contiguous little-endian bytes (a view of the tensor's memory)."""

    @classmethod
    def build(cls, request: EncodeRequest, part: EncodedPart) -> InlineAnswer:
        """The answer for ``part`` (no copy of the embedding: microseconds, fine on a loop)."""
        # Imported here: the data-parallel front renders answers and must never load torch.
        from encoder_pod.transfer.tensors import dtype_name, tensor_view

        embedding = part.embedding
        meta = {
            "status": "ok",
            "req_id": request.req_id,
            "modality": request.modality.value,
            "num_parts": request.num_parts,
            "part_idx": request.part_idx,
            "encoder_idx": request.encoder_idx,
            "embedding": {"dtype": dtype_name(embedding.dtype), "shape": list(embedding.shape)},
            "item_token_counts": list(part.item_tokens),
            "item_grids": [list(g) for g in part.item_grids],
        }
        return cls(meta, tensor_view(embedding))

    # --- across the data-parallel boundary ------------------------------------------------
    def to_wire(self) -> tuple[dict[str, Any], Buffer]:
        """(meta for a typed message, the raw frame that carries ``data``)."""
        return self.meta, self.data

    @classmethod
    def from_wire(cls, meta: dict[str, Any], frame: Buffer) -> InlineAnswer:
        """Inverse of :meth:`to_wire` (no copy of the frame)."""
        embedding = meta.get("embedding") if isinstance(meta, dict) else None
        if not isinstance(embedding, dict) or set(embedding) != {"dtype", "shape"}:
            raise ValueError("inline answer metadata without an embedding description")
        return cls(meta, frame)

    # --- rendering ----------------------------------------------------------------------------
    def render_json(self) -> list[Buffer]:
        """The JSON body as pieces to send in order (CPU work, base64: call it on a thread)."""
        before: list[bytes] = []
        after: list[bytes] = []
        opening = b""
        for key, value in self.meta.items():
            if key == "embedding":
                described = _json({**value, "encoding": "base64"})  # data goes before the closing '}'
                opening = _json(key) + b":" + described[:-1] + b',"data":"'
            else:
                (after if opening else before).append(_json(key) + b":" + _json(value))
        head = b"{" + b"".join(f + b"," for f in before) + opening
        tail = b'"}' + b"".join(b"," + f for f in after) + b"}"
        return [head, *_pieces(base64_of(memoryview(self.data).cast("B"))), tail]

    def wire_header(self, send_time: float) -> bytes:
        """Frame 0 of the wire format for this answer: what ``receiver.wire.pack_part_header`` writes
        for the same part (a test holds them equal; packed here so the data-parallel front, which
        renders answers, never imports the receiver library and its torch)."""
        meta, embedding = self.meta, self.meta["embedding"]
        if embedding["dtype"] not in WIRE_DTYPES:
            raise ValueError(f"embedding dtype {embedding['dtype']} has no wire format ({list(WIRE_DTYPES)})")
        header: dict[str, Any] = {
            "v": 1, "kind": "part", "req_id": meta["req_id"], "num_parts": meta["num_parts"],
            "part_idx": meta["part_idx"], "modality": meta["modality"], "send_time": float(send_time),
            "dtype": embedding["dtype"], "shape": [int(n) for n in embedding["shape"]],
            "item_tokens": [int(n) for n in meta["item_token_counts"]],
            "item_grids": [[int(n) for n in grid] for grid in meta["item_grids"]],
        }
        idx = _wire_idx(meta["encoder_idx"])
        if idx is not None:
            header["encoder_idx"] = idx
        return msgpack.packb(header, use_bin_type=True)

    def render_binary(self) -> list[Buffer]:
        """The wire-format body (frame 0's length, frame 0, the raw bytes); no copy of ``data``."""
        header = self.wire_header(time.time())
        return [_FRAME0_LENGTH.pack(len(header)) + header, *_pieces(self.data)]

    def render_msgpack(self) -> list[Buffer]:
        """One msgpack map: the JSON body's fields, ``embedding`` last with ``data`` as raw bin; no copy of ``data``."""
        fields = {key: value for key, value in self.meta.items() if key != "embedding"}
        packer = msgpack.Packer(use_bin_type=True)
        head = bytearray(packer.pack_map_header(len(fields) + 1))
        for key, value in fields.items():
            try:
                head += packer.pack(key) + packer.pack(value)
            except (OverflowError, TypeError, ValueError) as exc:  # an echoed value msgpack has no type for
                raise InvalidRequest(f"field {key!r} cannot be written as msgpack ({exc}); ask for JSON") from None
        head += packer.pack("embedding") + packer.pack_map_header(len(self.meta["embedding"]) + 2)
        for key, value in {**self.meta["embedding"], "encoding": "raw"}.items():
            head += packer.pack(key) + packer.pack(value)
        head += packer.pack("data") + _BIN32.pack(0xC6, memoryview(self.data).nbytes)
        return [head, *_pieces(self.data)]

    def body(self) -> dict[str, Any]:
        """The whole JSON body as a value (tests and in-process callers; copies ``data``)."""
        data = pybase64.b64encode(memoryview(self.data).cast("B")).decode("ascii")
        embedding = {**self.meta["embedding"], "encoding": "base64", "data": data}
        return {key: (embedding if key == "embedding" else value) for key, value in self.meta.items()}


def decode_embedding(payload: dict[str, Any]) -> np.ndarray:
    """Inverse of the JSON encoding, for clients and tests (bf16 comes back as float32)."""
    raw = pybase64.b64decode(payload["data"])
    shape = tuple(payload["shape"])
    if payload["dtype"] == "bfloat16":
        as_int = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return as_int.view(np.float32).reshape(shape)
    return np.frombuffer(raw, dtype=np.dtype(payload["dtype"]).newbyteorder("<")).reshape(shape)
