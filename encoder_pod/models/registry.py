"""Loading the adapter a checkpoint's family serves, and writing test checkpoints by family name."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import torch

from encoder_pod.models.base import BaseAdapter, EncoderAdapter
from encoder_pod.models.families import default_registry
from encoder_pod.models.checkpoint import Checkpoint, read_config
from encoder_pod.models.family import FamilyRegistry, Layout
from encoder_pod.models.hub import resolve_model_dir
from encoder_pod.settings import ModelSettings

log = logging.getLogger(__name__)

AdapterLoader = Callable[[ModelSettings], EncoderAdapter]
"""What the runtime calls (on a thread) to get its loaded adapter: :func:`load_adapter`, or a
tensor-parallel group's loader, which wraps it."""


def resolve_device(model: ModelSettings) -> torch.device:
    """``auto`` is cuda when a device is visible, else cpu."""
    if model.device == "cuda" or (model.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("ENCODER_DEVICE=cuda but no CUDA device is visible")
        return torch.device("cuda")
    return torch.device("cpu")


def resolve_dtype(model: ModelSettings, device: torch.device) -> torch.dtype:
    """``auto`` is bf16 on GPU and fp32 on CPU."""
    if model.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = getattr(torch, model.dtype)
    assert isinstance(dtype, torch.dtype)
    return dtype


def load_adapter(model: ModelSettings, registry: FamilyRegistry | None = None) -> BaseAdapter:
    """Discover ``model.model_path``'s family, build its adapter and load it (blocking: model load)."""
    families = registry or default_registry()
    checkpoint, cls = adapter_for(resolve_model_dir(model, encoder_weight_keys), families)
    device = resolve_device(model)
    adapter = cls(checkpoint, model, device, resolve_dtype(model, device))
    log.info("loading %s encoder (%s checkpoint) from %s on %s", cls.name, checkpoint.layout.value, checkpoint.path, device)
    adapter.load()
    return adapter


def encoder_weight_keys(model_dir: Path, keys: list[str], registry: FamilyRegistry | None = None) -> list[str]:
    """The tensors (of ``keys``, the checkpoint's) that serving the checkpoint in ``model_dir`` reads.

    Needs only config.json in ``model_dir``: ``fetch-model`` calls it before any shard is there.
    """
    checkpoint, cls = adapter_for(Path(model_dir), registry or default_registry())
    return cls.weight_keys(checkpoint, keys)


def adapter_for(model_dir: Path, families: FamilyRegistry) -> tuple[Checkpoint, type[BaseAdapter]]:
    """The checkpoint and its adapter class: its family's hand-written one, else the generic path.

    A checkpoint no family claims goes to :class:`~encoder_pod.models.generic.GenericAdapter`
    unless :func:`~encoder_pod.models.servable.refusal` refuses it (that error is raised).
    """
    config = read_config(model_dir)
    if families.recognise_all(model_dir, config):
        checkpoint = families.discover(model_dir)
        return checkpoint, families.get(checkpoint.family).adapter_class(checkpoint)
    from encoder_pod.models.generic import GenericAdapter, generic_checkpoint
    from encoder_pod.models.servable import refusal

    refused = refusal(model_dir, families)
    if refused is not None:
        raise refused
    checkpoint = generic_checkpoint(model_dir, config)
    return checkpoint, GenericAdapter.for_checkpoint(checkpoint)


def make_tiny_model(arch: str, out: Path, preset: str = "tiny", layout: Layout | None = None) -> Path:
    """Write a random-weight ``arch`` checkpoint and its processor config to ``out`` (offline).

    ``preset`` is ``tiny`` (tests) or ``moderate`` (benchmarks); ``layout`` defaults to the
    family's first tiny layout. ``config.json`` is written last, so a directory holding one is a
    complete checkpoint. Returns ``out``.
    """
    return default_registry().get(arch).write_tiny(Path(out), preset, layout)
