"""Rank 0 -> followers: headers and input tensors over the group's process group.

Only ``broadcast`` is used here, for the inputs; the matmul collectives are DTensor's (inside the
sharded modules). Every call is a collective: rank 0 and the followers call them in the same
order, which the group's dispatch lock guarantees on rank 0.
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.distributed as dist

from encoder_pod.parallel.tensor.messages import Header, TensorMeta, WireError
from encoder_pod.transfer.tensors import dtype_name

SRC = 0
"""Rank that owns the batcher and sends."""


class Channel:
    """Broadcasts on the group's serving process group; tensors travel on ``device`` (cuda for nccl)."""

    def __init__(self, device: torch.device, group: dist.ProcessGroup) -> None:
        self.device = device
        self.group = group

    def send(self, header: Header, tensors: Mapping[str, torch.Tensor]) -> None:
        """Rank 0: the header, then each tensor it names, in order."""
        payload = torch.frombuffer(bytearray(header.encode()), dtype=torch.uint8)
        dist.broadcast(torch.tensor([payload.numel()], dtype=torch.int64, device=self.device), SRC, group=self.group)
        dist.broadcast(payload.to(self.device), SRC, group=self.group)
        for meta in header.tensors:
            dist.broadcast(tensors[meta.key].to(self.device).contiguous(), SRC, group=self.group)

    def receive_header(self) -> Header:
        """Followers: the next header."""
        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        dist.broadcast(size, SRC, group=self.group)
        if not 0 < int(size.item()) <= 1 << 24:
            raise WireError(f"header of {int(size.item())} bytes")
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        dist.broadcast(payload, SRC, group=self.group)
        return Header.decode(payload.cpu().numpy().tobytes())

    def receive_tensors(self, metas: tuple[TensorMeta, ...]) -> dict[str, torch.Tensor]:
        """Followers: the tensors a FORWARD header names."""
        tensors = {}
        for meta in metas:
            tensor = torch.empty(meta.shape, dtype=getattr(torch, meta.dtype), device=self.device)
            dist.broadcast(tensor, SRC, group=self.group)
            tensors[meta.key] = tensor
        return tensors


def metas_of(inputs: Mapping[str, object]) -> tuple[TensorMeta, ...]:
    """Header entries for a batch's inputs; ValueError for a value that is not a tensor (never broadcast)."""
    metas = []
    for key, value in inputs.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"batch input {key!r} is a {type(value).__name__}, not a tensor: cannot be broadcast")
        metas.append(TensorMeta(key, dtype_name(value.dtype), tuple(value.shape)))
    return tuple(metas)
