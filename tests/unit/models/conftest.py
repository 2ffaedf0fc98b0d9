"""Fixtures for the adapter tests: loaded tiny adapters and synthetic images."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from PIL import Image

from encoder_pod.modality import Modality
from encoder_pod.models.base import EncoderAdapter, MediaItem


def _load(path: Path, **env: str) -> EncoderAdapter:
    """Load a checkpoint the way the server does: settings from env, then the registry."""
    from encoder_pod.models.registry import load_adapter
    from encoder_pod.settings import load_settings

    return load_adapter(load_settings(env={"ENCODER_MODEL_PATH": str(path), **env}).model)


@pytest.fixture(scope="session")
def tiny_adapter(tiny_model: Callable[[str], Path]) -> Callable[[str], EncoderAdapter]:
    """``tiny_adapter(arch)`` -> the loaded fp32 CPU adapter, one per arch per session (read-only)."""
    loaded: dict[str, EncoderAdapter] = {}

    def get(arch: str) -> EncoderAdapter:
        if arch not in loaded:
            loaded[arch] = _load(tiny_model(arch), ENCODER_DEVICE="cpu", ENCODER_DTYPE="float32")
        return loaded[arch]

    return get


def _image(width: int, height: int, seed: int = 0) -> MediaItem:
    """A random-noise RGB image item: distinct content per seed, so swapped rows would show."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return MediaItem(Modality.IMAGE, Image.fromarray(pixels, mode="RGB"))


@pytest.fixture(scope="session")
def make_image() -> Callable[..., MediaItem]:
    """``make_image(width, height, seed=0)`` -> a noise IMAGE item."""
    return _image


@pytest.fixture(scope="session")
def load_checkpoint() -> Callable[..., EncoderAdapter]:
    """``load_checkpoint(path, **env)`` -> adapter loaded through settings and the registry."""
    return _load
