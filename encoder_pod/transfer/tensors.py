"""A CPU tensor's bytes as they travel: little-endian, contiguous, bf16 as raw 16-bit words.

Shared by every transfer format (the inline answer, the pushed frames of either wire format) so
none of them imports another for a helper.
"""

from __future__ import annotations

import sys

import torch

# bf16 has no numpy dtype: its bytes travel as-is and the dtype name tells the reader.
_RAW_VIEW = {torch.bfloat16: torch.int16}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``float32`` (the name every format carries)."""
    return str(dtype).removeprefix("torch.")


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """Contiguous little-endian bytes of a CPU tensor (a copy)."""
    t = tensor.detach().to("cpu").contiguous()
    arr = t.view(_RAW_VIEW[t.dtype]).numpy() if t.dtype in _RAW_VIEW else t.numpy()
    if sys.byteorder != "little":
        arr = arr.byteswap()
    return arr.tobytes()


def tensor_view(tensor: torch.Tensor) -> memoryview:
    """The contiguous little-endian bytes of a CPU tensor, as a view of its memory (no copy).

    The view keeps the tensor alive, so ZMQ may send from it after the caller dropped the tensor.
    """
    t = tensor.detach()
    if t.device.type != "cpu" or not t.is_contiguous() or sys.byteorder != "little":
        # Rare (the adapters hand out contiguous CPU tensors; hosts are little-endian): copy once.
        return memoryview(tensor_bytes(t))
    if not t.numel():
        return memoryview(b"")
    array = t.view(torch.uint8).numpy()
    return memoryview(array.data).cast("B")
