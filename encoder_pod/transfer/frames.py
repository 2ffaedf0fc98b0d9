"""What a push looks like on the wire: the frame codecs of ENCODER_WIRE_FORMAT.

``sglang`` (the default) writes the pickled frame SGLang's own receiver reads (see
:mod:`encoder_pod.transfer.sglang_frames`). ``encoderpool`` writes docs/wire-format.md: a msgpack
header and the raw tensor bytes, for :mod:`encoder_pod.receiver`. Both send the embedding zero-copy: frame 1 is a view
of the tensor's memory, handed to ZMQ without a copy.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from encoder_pod.errors import EncoderError
from encoder_pod.models.base import EncodedPart
from encoder_pod.protocol import EncodeRequest
from encoder_pod.receiver.wire import DTYPE_SIZES, pack_error_header, pack_part_header
from encoder_pod.transfer.tensors import dtype_name, tensor_view


class FrameCodec(Protocol):
    """Turns a result or an error into the frames of one ZMQ multipart message."""

    name: str

    def part_frames(self, request: EncodeRequest, part: EncodedPart) -> list[Any]:
        """Frames of an embedding part."""

    def error_frames(self, request: EncodeRequest, error: EncoderError) -> list[Any]:
        """Frames of an error part (the receiver stops waiting for this request)."""


def _encoder_idx(request: EncodeRequest) -> int | str | None:
    idx = request.encoder_idx
    return idx if isinstance(idx, (int, str)) and not isinstance(idx, bool) else None


class EncoderpoolCodec:
    """The project's own format (version 1): no pickle anywhere."""

    name = "encoderpool"

    def part_frames(self, request: EncodeRequest, part: EncodedPart) -> list[Any]:
        """Header + zero-copy payload."""
        dtype = dtype_name(part.embedding.dtype)
        if dtype not in DTYPE_SIZES:
            # Embeddings are float tensors; anything else is a bug upstream, not a wire concern.
            raise ValueError(f"embedding dtype {dtype} cannot travel on the wire ({sorted(DTYPE_SIZES)})")
        header = pack_part_header(
            req_id=request.req_id,
            num_parts=request.num_parts,
            part_idx=request.part_idx,
            modality=request.modality,
            dtype=dtype,
            shape=list(part.embedding.shape),
            item_tokens=part.item_tokens,
            item_grids=part.item_grids,
            send_time=time.time(),
            encoder_idx=_encoder_idx(request),
        )
        return [header, tensor_view(part.embedding)]

    def error_frames(self, request: EncodeRequest, error: EncoderError) -> list[Any]:
        """A single header frame with the error's kind, HTTP status and message."""
        return [
            pack_error_header(
                req_id=request.req_id,
                num_parts=request.num_parts,
                part_idx=request.part_idx,
                modality=request.modality,
                error_kind=error.kind,
                error_code=error.http_status,
                error_msg=error.message,
                send_time=time.time(),
                encoder_idx=_encoder_idx(request),
            )
        ]


def codec_for(wire_format: str) -> FrameCodec:
    """The codec named by ENCODER_WIRE_FORMAT (``encoderpool`` or ``sglang=<release>``)."""
    if wire_format == "encoderpool":
        return EncoderpoolCodec()
    kind, _, release = wire_format.partition("=")
    if kind == "sglang" and release:
        from encoder_pod.transfer.sglang_frames import SglangCodec

        return SglangCodec(release)
    raise ValueError(f"ENCODER_WIRE_FORMAT {wire_format!r}: expected 'encoderpool' or 'sglang=<release>'")
