"""Every transfer backend's control operations, in one tuple: the one registration of a backend.

A backend whose prefill ranks call back declares its :class:`~encoder_pod.transfer.control.ControlOp`
values in its own module and is added to :data:`CONTROL_OPS` here; the HTTP routes, the gRPC face,
the data-parallel front and worker, and the :class:`~encoder_pod.transfer.router.TransferRouter`
all read this tuple and route by name. Imports no torch.
"""

from __future__ import annotations

from encoder_pod.transfer import mooncake, receive_urls
from encoder_pod.transfer.control import ControlOp, lookup

CONTROL_OPS: tuple[ControlOp, ...] = (*receive_urls.CONTROL_OPS, *mooncake.CONTROL_OPS)
"""Every control operation of every backend (names and paths unique: checked by a unit test)."""


def control_op(name: str) -> ControlOp:
    """The registered operation called ``name``; UnknownControlOp (500) when none is."""
    return lookup(CONTROL_OPS, name)
