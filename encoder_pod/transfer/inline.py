"""The ``inline`` backend: the embedding comes back in the /encode response.

For clients that are not prefill servers (tests, batch jobs, other frameworks). The tensor is
base64 of its little-endian bytes, with dtype and shape, plus the per-item token counts.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from encoder_pod.models.base import EncodedPart
from encoder_pod.protocol import EncodeRequest
from encoder_pod.transfer.base import Transfer
from encoder_pod.transfer.tensors import dtype_name, tensor_bytes


def decode_embedding(payload: dict[str, Any]) -> np.ndarray:
    """Inverse of the inline encoding, for clients and tests (bf16 comes back as float32)."""
    raw = base64.b64decode(payload["data"])
    shape = tuple(payload["shape"])
    if payload["dtype"] == "bfloat16":
        as_int = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return as_int.view(np.float32).reshape(shape)
    return np.frombuffer(raw, dtype=np.dtype(payload["dtype"]).newbyteorder("<")).reshape(shape)


def inline_body(request: EncodeRequest, part: EncodedPart) -> dict[str, Any]:
    """The JSON response body of a successful inline encode."""
    return {
        "status": "ok",
        "req_id": request.req_id,
        "modality": request.modality.value,
        "num_parts": request.num_parts,
        "part_idx": request.part_idx,
        "encoder_idx": request.encoder_idx,
        "embedding": {
            "dtype": dtype_name(part.embedding.dtype),
            "shape": list(part.embedding.shape),
            "encoding": "base64",
            "data": base64.b64encode(tensor_bytes(part.embedding)).decode("ascii"),
        },
        "item_token_counts": list(part.item_tokens),
        "item_grids": [list(g) for g in part.item_grids],
    }


class InlineTransfer(Transfer):
    """Returns the embedding in the HTTP response."""

    name = "inline"

    async def deliver(self, request: EncodeRequest, part: EncodedPart) -> dict[str, Any]:
        """The response body carrying the embedding."""
        return inline_body(request, part)
