"""The ``inline`` backend: the embedding comes back in the /encode response.

For clients that are not prefill servers (tests, batch jobs, other frameworks). The answer is
the JSON body ``{"status": "ok", "req_id", ..., "embedding": {"dtype", "shape", "encoding":
"base64", "data"}, "item_token_counts", "item_grids"}``; ``data`` is base64 of the tensor's
little-endian bytes (bf16 as raw 16-bit words).

This module alone builds and renders that body. In between it is an :class:`InlineAnswer`: the
body's small fields (``meta``) and the base64 text as one raw buffer (``data``), which crosses
the data-parallel boundary as a frame of its own and is never copied into a JSON or msgpack
value. Building (base64) and rendering are CPU work for a thread, never an event loop; both work
in slices of about a megabyte, so the thread gives the GIL back between them and the loop that
waits stays responsive (a multi-megabyte answer never stalls ``/health``).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from encoder_pod.protocol import EncodeRequest

if TYPE_CHECKING:
    from encoder_pod.models.base import EncodedPart

BASE64_SLICE = 3 * 256 * 1024
"""Bytes encoded per step (a multiple of 3, so the slices' base64 concatenates exactly)."""

PIECE = 1 << 20
"""Bytes of the rendered body per piece handed to the HTTP server."""

Buffer = bytes | bytearray | memoryview


def _json(value: Any) -> str:
    # As the HTTP edge renders every other body (Starlette's JSONResponse settings).
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def base64_of(view: memoryview) -> bytearray:
    """Base64 of ``view``, encoded slice by slice into one preallocated buffer."""
    out = bytearray(4 * ((len(view) + 2) // 3))
    for start in range(0, len(view), BASE64_SLICE):
        encoded = binascii.b2a_base64(view[start : start + BASE64_SLICE], newline=False)
        at = start // 3 * 4
        out[at : at + len(encoded)] = encoded
    return out


@dataclass(frozen=True)
class InlineAnswer:
    """A successful inline answer: the body's fields and the embedding's base64 text, apart."""

    meta: dict[str, Any]
    """The response body without ``embedding.data`` (key order is the body's)."""
    data: Buffer
    """``embedding.data``: the base64 text, ASCII."""

    @classmethod
    def build(cls, request: EncodeRequest, part: EncodedPart) -> InlineAnswer:
        """The answer for ``part`` (CPU work: call it on a thread)."""
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
            "embedding": {"dtype": dtype_name(embedding.dtype), "shape": list(embedding.shape), "encoding": "base64"},
            "item_token_counts": list(part.item_tokens),
            "item_grids": [list(g) for g in part.item_grids],
        }
        return cls(meta, base64_of(tensor_view(embedding)))

    # --- across the data-parallel boundary ------------------------------------------------
    def to_wire(self) -> tuple[dict[str, Any], Buffer]:
        """(meta for a typed message, the raw frame that carries ``data``)."""
        return self.meta, self.data

    @classmethod
    def from_wire(cls, meta: dict[str, Any], frame: Buffer) -> InlineAnswer:
        """Inverse of :meth:`to_wire` (no copy of the frame)."""
        embedding = meta.get("embedding") if isinstance(meta, dict) else None
        if not isinstance(embedding, dict) or "data" in embedding:
            raise ValueError("inline answer metadata without an embedding description")
        return cls(meta, frame)

    # --- rendering ----------------------------------------------------------------------------
    def render(self) -> list[Buffer]:
        """The JSON body as pieces to send in order (CPU work for a thread; ``data`` is not copied)."""
        before: list[str] = []
        after: list[str] = []
        opening = ""
        for key, value in self.meta.items():
            if key == "embedding":
                described = _json(value)  # '{"dtype":...,"encoding":"base64"}': data goes before the '}'
                opening = f"{_json(key)}:{described[:-1]}{',' if value else ''}\"data\":\""
            else:
                (after if opening else before).append(f"{_json(key)}:{_json(value)}")
        head = "{" + "".join(f + "," for f in before) + opening
        tail = '"}' + "".join("," + f for f in after) + "}"
        view = memoryview(self.data)
        return [head.encode(), *(view[at : at + PIECE] for at in range(0, len(view), PIECE)), tail.encode()]

    def body(self) -> dict[str, Any]:
        """The whole body as a JSON value (tests and in-process callers; copies ``data``)."""
        embedding = {**self.meta["embedding"], "data": bytes(self.data).decode("ascii")}
        return {key: (embedding if key == "embedding" else value) for key, value in self.meta.items()}


def decode_embedding(payload: dict[str, Any]) -> np.ndarray:
    """Inverse of the inline encoding, for clients and tests (bf16 comes back as float32)."""
    raw = base64.b64decode(payload["data"])
    shape = tuple(payload["shape"])
    if payload["dtype"] == "bfloat16":
        as_int = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return as_int.view(np.float32).reshape(shape)
    return np.frombuffer(raw, dtype=np.dtype(payload["dtype"]).newbyteorder("<")).reshape(shape)
