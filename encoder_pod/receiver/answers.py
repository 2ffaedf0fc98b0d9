"""Reading an inline /encode answer on the caller's side, in any of its three renderings.

``Accept: application/octet-stream`` gets the wire format in one body (frame 0's length, the
msgpack part header, the raw tensor bytes; :func:`~encoder_pod.receiver.wire.split_body`),
``application/x-msgpack`` a msgpack map with the raw bytes as ``bin``, anything else JSON with
base64. Each is checked as strictly as a pushed part: :func:`decode_answer` returns the same
:class:`~encoder_pod.receiver.wire.WireHeader` a push would carry and the embedding as a tensor
that owns its memory, or raises :class:`~encoder_pod.receiver.errors.MalformedMessage` (or a
subclass). The JSON and msgpack answers carry no ``send_time``: it reads 0.
"""

from __future__ import annotations

import binascii
from typing import Any

import msgpack
import orjson
import pybase64
import torch

from encoder_pod import json_limits
from encoder_pod.receiver.errors import MalformedMessage, PayloadMismatch
from encoder_pod.receiver.wire import KIND_PART, MAX_HEADER_BYTES, WIRE_VERSION, WireHeader, decode_fields, decode_message, split_body

BINARY = "application/octet-stream"
MSGPACK = "application/x-msgpack"
JSON = "application/json"

ACCEPT = {"binary": BINARY, "msgpack": MSGPACK, "json": JSON}
"""The ``Accept`` header that asks for each rendering (the names :class:`EncoderClient` takes)."""


def to_tensor(header: WireHeader, payload: memoryview | bytes) -> torch.Tensor:
    """The payload as a tensor that owns its memory (one copy), shaped as the header says."""
    if len(payload) != header.payload_nbytes:
        raise PayloadMismatch(
            f"payload is {len(payload)} bytes but dtype {header.dtype} and shape {list(header.shape or ())} "
            f"need {header.payload_nbytes}",
            req_id=header.req_id,
        )
    assert header.shape is not None
    return torch.frombuffer(bytearray(payload), dtype=getattr(torch, header.dtype or "")).reshape(header.shape)


def _header(body: Any, data_key: str) -> tuple[WireHeader, Any]:
    """The wire header an inline answer's fields amount to, and its embedding's ``data`` value."""
    if not isinstance(body, dict) or body.get("status") != "ok":
        raise MalformedMessage(f"answer is not a successful inline answer: {str(body)[:200]}")
    embedding = body.get("embedding")
    if not isinstance(embedding, dict) or data_key not in embedding:
        raise MalformedMessage("answer has no embedding data", req_id=body.get("req_id") if isinstance(body.get("req_id"), str) else None)
    idx = body.get("encoder_idx")
    fields = {
        "v": WIRE_VERSION, "kind": KIND_PART, "send_time": 0.0,
        **{k: body.get(k) for k in ("req_id", "num_parts", "part_idx", "modality", "item_grids")},
        "item_tokens": body.get("item_token_counts"),
        "dtype": embedding.get("dtype"), "shape": embedding.get("shape"),
    }
    if isinstance(idx, (int, str)) and not isinstance(idx, bool):
        fields["encoder_idx"] = idx
    return decode_fields(fields), embedding[data_key]


def _json_answer(body: bytes) -> tuple[WireHeader, bytes]:
    try:
        # orjson, then the nesting bound on the value (json_limits); anything orjson refuses or that
        # nests too deep is read again by json_limits.loads, whose errors name the reason.
        value = orjson.loads(body)
        if json_limits.nesting_over(value) is not False:
            raise ValueError("nested too deep")
    except ValueError:
        try:
            value = json_limits.loads(body)
        except ValueError as exc:  # the standard library's decode errors, JsonTooDeep
            raise MalformedMessage(f"answer is not JSON ({exc})") from None
    header, data = _header(value, "data")
    if value["embedding"].get("encoding") != "base64" or not isinstance(data, str):
        raise MalformedMessage("JSON answer's embedding is not base64 text", req_id=header.req_id)
    try:
        return header, pybase64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MalformedMessage(f"JSON answer's embedding is not base64 ({exc})", req_id=header.req_id) from None


def _msgpack_answer(body: bytes) -> tuple[WireHeader, bytes]:
    try:
        value = msgpack.unpackb(body, raw=False, strict_map_key=True, max_str_len=MAX_HEADER_BYTES)
    except Exception as exc:  # noqa: BLE001 - msgpack raises a zoo of types on hostile bytes
        raise MalformedMessage(f"answer is not msgpack ({type(exc).__name__}: {exc})") from None
    header, data = _header(value, "data")
    if value["embedding"].get("encoding") != "raw" or not isinstance(data, bytes):
        raise MalformedMessage("msgpack answer's embedding is not raw bytes", req_id=header.req_id)
    return header, data


def decode_answer(content_type: str | None, body: bytes) -> tuple[WireHeader, torch.Tensor]:
    """A 200 inline answer (its ``Content-Type`` and body) -> (header, embedding). CPU work: for a
    large body, call it on a thread."""
    media_type = (content_type or JSON).split(";", 1)[0].strip().lower()
    if media_type == BINARY:
        header, payload = decode_message(split_body(body))
        if payload is None:
            raise MalformedMessage("binary answer is an error part", req_id=header.req_id)
        return header, to_tensor(header, payload)
    if media_type in (MSGPACK, "application/msgpack", "application/vnd.msgpack"):
        header, raw = _msgpack_answer(body)
    else:
        header, raw = _json_answer(body)
    return header, to_tensor(header, raw)
