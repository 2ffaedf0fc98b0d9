"""What discovery finds in a checkpoint directory: its config.json, its layout, its family.

Plain data, no torch: :mod:`encoder_pod.models.family` (discovery) and
:mod:`encoder_pod.models.base` (the adapters built from a checkpoint) both use it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Mapping

from encoder_pod.facts import FileFact

SMALL_FILE_BYTES = 8 * 1024 * 1024
"""Files up to this size are hashed whole (configs, processor files, tokenizers); larger ones
(weights) by name, size and modification time, so identifying a 100 GB checkpoint costs nothing."""


class Layout(str, Enum):
    """How a family's checkpoint is laid out on disk."""

    TOWER = "tower"
    """The encoder tower saved on its own (``save_pretrained`` of the vision or audio model)."""
    FULL = "full"
    """A whole multimodal checkpoint (language model included); the encoder side is read out of it."""


def read_config(model_dir: Path) -> dict[str, Any]:
    """The checkpoint's config.json as a dict (ValueError when it is not a JSON object)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    if not isinstance(config, dict):
        raise ValueError(f"{Path(model_dir) / 'config.json'} is not a JSON object")
    return config


def file_facts(model_dir: Path) -> tuple[FileFact, ...]:
    """Every file under ``model_dir`` (links followed), in path order (:attr:`ModelIdentity.files`)."""
    facts: list[FileFact] = []
    for root, dirs, files in os.walk(model_dir, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            try:
                stat = path.stat()
            except OSError:
                continue
            rel = str(path.relative_to(model_dir))
            if stat.st_size <= SMALL_FILE_BYTES:
                facts.append((rel, hashlib.sha256(path.read_bytes()).hexdigest()))
            else:
                facts.append((rel, stat.st_size, stat.st_mtime_ns))
    return tuple(facts)


@dataclass(frozen=True)
class Checkpoint:
    """What discovery found in a checkpoint directory."""

    path: Path
    family: str
    """The family's name (``make-tiny-model --arch``), e.g. ``qwen2_vl``."""
    layout: Layout
    model_type: str
    architecture: str | None
    """The class config.json names (one the family accepts), or None when it names none."""
    config: Mapping[str, Any] = field(repr=False, compare=False)
    """config.json as read."""
