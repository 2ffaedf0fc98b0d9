"""Choosing and loading the adapter named by a checkpoint's config."""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

import torch

from encoder_pod.models.base import EncoderAdapter, read_config
from encoder_pod.settings import EncoderSettings, model_dir

log = logging.getLogger(__name__)

# arch name -> "module:Class". Imported lazily so one family's optional pieces never block another.
ADAPTERS: dict[str, str] = {
    "qwen2_vl": "encoder_pod.models.qwen2_vl:Qwen2VLAdapter",
    "qwen2_5_vl": "encoder_pod.models.qwen2_vl:Qwen25VLAdapter",
    "clip": "encoder_pod.models.clip:CLIPAdapter",
    "siglip": "encoder_pod.models.clip:SiglipAdapter",
    "llava_next": "encoder_pod.models.llava_next:LlavaNextAdapter",
    "whisper": "encoder_pod.models.whisper:WhisperAdapter",
    "qwen2_audio": "encoder_pod.models.whisper:Qwen2AudioAdapter",
}


def adapter_class(arch: str) -> type[EncoderAdapter]:
    """The adapter class for an architecture name; ValueError lists the known ones."""
    try:
        module_name, cls_name = ADAPTERS[arch].split(":")
    except KeyError:
        raise ValueError(f"unknown arch {arch!r}; known: {', '.join(sorted(ADAPTERS))}") from None
    return getattr(importlib.import_module(module_name), cls_name)


def resolve_adapter(path: Path) -> type[EncoderAdapter]:
    """The one adapter whose ``matches`` accepts this checkpoint's config."""
    config = read_config(path)
    found = [cls for cls in map(adapter_class, ADAPTERS) if cls.matches(config)]
    if len(found) != 1:
        kind = config.get("architectures") or config.get("model_type")
        raise ValueError(
            f"{'no' if not found else 'more than one'} encoder adapter for checkpoint {str(path)!r} "
            f"(architectures/model_type {kind!r}); supported: {', '.join(sorted(ADAPTERS))}"
        )
    return found[0]


def resolve_device(settings: EncoderSettings) -> torch.device:
    """``auto`` is cuda when a device is visible, else cpu."""
    if settings.device == "cuda" or (settings.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("ENCODER_DEVICE=cuda but no CUDA device is visible")
        return torch.device("cuda")
    return torch.device("cpu")


def resolve_dtype(settings: EncoderSettings, device: torch.device) -> torch.dtype:
    """``auto`` is bf16 on GPU and fp32 on CPU."""
    if settings.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, settings.dtype)


def load_adapter(settings: EncoderSettings) -> EncoderAdapter:
    """Build and load the adapter for ``settings.model_path`` (blocking: model load)."""
    path = model_dir(settings)
    cls = resolve_adapter(path)
    device = resolve_device(settings)
    adapter = cls(path, settings, device, resolve_dtype(settings, device))
    log.info("loading %s encoder from %s on %s", cls.name, path, device)
    adapter.load()
    return adapter


def make_tiny_model(arch: str, out: Path, preset: str = "tiny") -> Path:
    """Write a random-weight ``arch`` checkpoint and its processor config to ``out`` (offline).

    ``preset`` is ``tiny`` (tests) or ``moderate`` (benchmarks). ``config.json`` is written last,
    so a directory holding one is a complete checkpoint. Returns ``out``.
    """
    out = Path(out)
    adapter_class(arch).write_tiny(out, preset)
    return out
