"""What every image-encoder adapter shares: item checks, strict loading and tiny-checkpoint writing.

The family modules (``qwen2_vl``, ``clip``) only say which HF classes to use and how output rows
are counted; the rules a user can notice (which images are refused and why) live here so every
image model the pod serves accepts the same images.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np
import torch
from PIL import Image

from encoder_pod.errors import MediaError
from encoder_pod.modality import Modality
from encoder_pod.models.base import BaseAdapter, MediaItem, check_loading_info

MAX_ASPECT_RATIO = 200
"""Longest side over shortest side. Qwen2-VL's smart_resize raises above this; CLIP resizes the
shortest edge first, so without a bound a 1 x 20000 image would become a 224 x 4.5M intermediate."""

PRESETS = ("tiny", "moderate")
"""``tiny``: unit tests (about 1 MB). ``moderate``: benchmarks (docs/benchmarks.md)."""

HEALTH_IMAGE_SIDE = 32


def image_size(item: MediaItem, modalities: frozenset[Modality]) -> tuple[int, int]:
    """(width, height) of an IMAGE item; :class:`MediaError` with a user-facing reason otherwise.

    Images whose aspect ratio exceeds :data:`MAX_ASPECT_RATIO` are refused. Tiny images (1 x 1,
    3 x 500) are accepted: the processors upscale them, and adapters always tell the processor
    the layout is channels-last so a 3-pixel side is never mistaken for the channel axis.
    """
    if item.modality not in modalities:
        served = ", ".join(sorted(m.value for m in modalities))
        raise MediaError(f"this model encodes {served} items, not {item.modality.value}")
    if not isinstance(item.data, Image.Image):
        raise MediaError(f"an IMAGE item must be a decoded image, got {type(item.data).__name__}")
    width, height = item.data.size
    if width < 1 or height < 1:
        raise MediaError(f"image is empty ({width}x{height})")
    ratio = max(width, height) / min(width, height)
    if ratio > MAX_ASPECT_RATIO:
        raise MediaError(
            f"image {width}x{height} has aspect ratio {ratio:.0f}:1; at most {MAX_ASPECT_RATIO}:1 is accepted"
        )
    return width, height


def flatten(requests: Sequence[Sequence[MediaItem]]) -> list[Image.Image]:
    """All images of all requests, in request then item order (the order output rows come in)."""
    images = [_rgb(item.data) for items in requests for item in items]
    if not images:
        raise ValueError("a batch needs at least one item")
    return images


def regroup(flat: Sequence[Any], requests: Sequence[Sequence[MediaItem]]) -> list[list[Any]]:
    """Split per-item values (in :func:`flatten` order) back into one list per request."""
    grouped: list[list[Any]] = []
    start = 0
    for items in requests:
        grouped.append(list(flat[start : start + len(items)]))
        start += len(items)
    if start != len(flat):
        raise ValueError(f"{len(flat)} per-item values for {start} items")
    return grouped


def _rgb(image: Image.Image) -> Image.Image:
    # Not left to the processor: a checkpoint whose config says do_convert_rgb false would hand a
    # 1-channel L or 4-channel RGBA array to a 3-channel normalisation and fail the whole batch.
    return image if image.mode == "RGB" else image.convert("RGB")


def health_image() -> MediaItem:
    """A 32x32 RGB gradient: valid for every family, cheap, and not a constant image."""
    ramp = np.linspace(0, 255, HEALTH_IMAGE_SIDE, dtype=np.uint8)
    pixels = np.stack(np.broadcast_arrays(ramp[None, :], ramp[:, None], ramp[::-1, None]), axis=-1)
    return MediaItem(Modality.IMAGE, Image.fromarray(np.ascontiguousarray(pixels), mode="RGB"))


class VisionAdapter(BaseAdapter):
    """Shared plumbing of the image adapters: strict load, processor call, health item."""

    modalities: ClassVar[frozenset[Modality]] = frozenset({Modality.IMAGE})

    model: Any
    processor: Any

    def health_item(self, modality: Modality) -> MediaItem:
        """A 32x32 image (IMAGE is the only modality served)."""
        if modality not in self.modalities:
            raise ValueError(f"{self.name} has no {modality.value} health item")
        return health_image()

    def _load_checked(self, model_cls: type[Any]) -> Any:
        """``from_pretrained`` that refuses missing, unexpected or mismatched weights."""
        model, info = model_cls.from_pretrained(self.model_dir, dtype=self.dtype, output_loading_info=True)
        check_loading_info(model_cls.__name__, info)
        return model.to(self.device).eval()

    def _process(self, images: list[Image.Image]) -> Any:
        """ONE processor call for the whole batch, channels-last declared (see :func:`image_size`)."""
        return self.processor(images=images, return_tensors="pt", input_data_format="channels_last")


def check_preset(preset: str) -> None:
    """ValueError naming the known presets."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int) -> None:
    """Seeded random weights that differ from a fresh init in every tensor.

    A fresh init has unit norm weights and zero biases; a checkpoint that silently fell back to
    init (a missing key) would then look plausible. Here norms are ``1 + noise`` and every other
    tensor is small noise, so such a fallback changes the output visibly.
    """
    # Norm layers are found by class (LayerNorm, Qwen2RMSNorm ...): their names vary (ln_q, norm1).
    norm_scales = {
        id(module.weight)
        for module in model.modules()
        if "norm" in type(module).__name__.lower() and isinstance(getattr(module, "weight", None), torch.Tensor)
    }
    generator = torch.Generator().manual_seed(seed)
    for param in model.parameters():
        noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
        param.copy_(1.0 + 0.1 * noise if id(param) in norm_scales else 0.02 * noise)


def save_atomically(out: Path, write: Any) -> None:
    """Run ``write(tmp_dir)`` then move its files into ``out``, ``config.json`` last.

    Readers (a test cache, ``make run``) take a present config.json as "checkpoint complete", so it
    must never appear before the weights and the processor config.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(tmp)
        names = sorted(p.name for p in tmp.iterdir())
        for name in sorted(names, key=lambda n: n == "config.json"):
            os.replace(tmp / name, out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
