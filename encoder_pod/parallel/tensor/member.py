"""What every rank of a tensor-parallel group does to join it: process group, model, shards.

Rank 0 hosts the rendezvous store (a TCPStore on a free loopback port, so there is no port race)
and passes its port to the followers it starts. Joining (rendezvous, loading the tower, the
barrier before sharding) is bounded by :data:`JOIN_TIMEOUT_S`: interpreter start and weight
loading take as long as they take on a busy host. Everything after it (sharding, every forward,
every broadcast) runs on a process group of its own whose timeout is
``ENCODER_TP_COLLECTIVE_TIMEOUT``: a rank that dies or hangs while serving turns into an error
on the others within that bound, never a hang forever.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from encoder_pod.models.base import BaseAdapter
from encoder_pod.models.registry import load_adapter, resolve_device
from encoder_pod.parallel.tensor.channel import Channel
from encoder_pod.parallel.tensor.sharding import NotShardable, check_shardable, shard_tower
from encoder_pod.settings import EncoderSettings, ModelSettings

log = logging.getLogger(__name__)

STORE_HOST = "127.0.0.1"
"""A group never leaves its pod: every rank is a process on this machine."""

JOIN_TIMEOUT_S = 600.0
"""How long the ranks of a group may take to meet and load their weights (not a serving bound)."""


def backend_for(device: torch.device) -> str:
    """nccl between GPUs, gloo on CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(model: ModelSettings, rank: int) -> torch.device:
    """This rank's device: GPU ``rank`` of the group's visible ones, or the CPU."""
    device = resolve_device(model)
    if device.type == "cuda":
        # The group sees its T GPUs; rank r takes the r-th. Later .to("cuda") calls follow it.
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return device


def open_store(rank: int, tp_size: int, port: int) -> dist.TCPStore:
    """The rendezvous store: rank 0 serves it (port 0 picks a free one), followers connect."""
    return dist.TCPStore(
        STORE_HOST, port, tp_size, is_master=rank == 0, timeout=timedelta(seconds=JOIN_TIMEOUT_S), wait_for_workers=False
    )


def join(settings: EncoderSettings, store: dist.Store, rank: int) -> tuple[BaseAdapter, Channel]:
    """Init the process group, load the tower, shard it; returns (adapter, channel).

    Every rank calls this in the same order: sharding distributes parameters collectively.
    """
    # The default group only joins (generous timeout); serving runs on ``serving`` (collective timeout).
    tp_size = settings.parallel.tp_size
    device = rank_device(settings.model, rank)
    if device.type == "cpu":
        # gloo picks an interface from the hostname, which a container may not route; the group
        # is local, so loopback always works.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        backend_for(device),
        store=store,
        rank=rank,
        world_size=tp_size,
        timeout=timedelta(seconds=JOIN_TIMEOUT_S),
        device_id=device if device.type == "cuda" else None,
    )
    adapter = load_adapter(settings.model)
    model = tower_of(adapter)
    try:
        check_shardable(model, tp_size)
    except NotShardable as exc:
        raise RuntimeError(f"cannot split {adapter.name} over ENCODER_TP_SIZE={tp_size}: {exc}") from None
    dist.barrier()  # every rank loaded: from here on the ranks move in step
    serving = dist.new_group(list(range(tp_size)), timeout=timedelta(seconds=settings.parallel.tp_collective_timeout))
    assert isinstance(serving, dist.ProcessGroup)  # every rank is a member
    mesh = DeviceMesh.from_group(serving, device.type)
    shard_tower(model, mesh)
    log.info("rank %d of %d: %s sharded on %s", rank, tp_size, adapter.name, device)
    return adapter, Channel(device, serving)


def tower_of(adapter: BaseAdapter) -> Any:
    """The module the adapter's forward runs (CLIP's trimmed tower, Qwen's whole model)."""
    tower = getattr(adapter, "tower", None) or getattr(adapter, "model", None)
    if tower is None:
        raise RuntimeError(f"{adapter.name}: tensor parallel needs an adapter with a model")
    return tower


def leave() -> None:
    """Destroy the process group (so torch does not warn at exit about a leaked one)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def is_collective_failure(exc: BaseException) -> bool:
    """True when ``exc`` comes from the process group (a dead peer, a timeout): the group is broken."""
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc).lower()
    return any(word in text for word in ("gloo", "nccl", "timed out", "connection closed", "connection reset"))
