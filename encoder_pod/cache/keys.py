"""Cache keys: what makes two items the same item for this pod's model.

A key is ``sha256(namespace | modality | content digest)``:

- the **namespace** (:func:`model_namespace`) is computed once per loaded model: the model's
  identity (family, layout, class, checkpoint directory, which for a hub checkpoint is the
  revision's snapshot, a digest of every small file in it: config.json and the processor configs,
  and name, size and modification time of every weight file), the dtype and device, the
  tensor-parallel size (sharded reductions round differently), and the settings that change what
  the processor produces (video sampling, the GPU image processor). Two models never share a
  namespace, so the cache cannot hand one model's rows to another.
- the **content digest** (:func:`content_digest`) is the sha256 of the item's bytes once its
  source is resolved (base64 decoded, URL fetched, file read): exactly what a client's
  ``content_hash`` (``sha256:<hex>``) names. A verified ``content_hash`` is used as it is (no
  second hash); either way the same bytes give the same key whether they came as a data: URI,
  raw base64, a file or a URL.

Item options SGLang forwards (``detail``, ``max_pixels`` ...) are not part of the key: no family
served here applies them (only the server-wide processor config does). A family that starts
applying one must add it here.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

from encoder_pod.modality import Modality
from encoder_pod.settings import EncoderSettings

KEY_FORMAT = 1
"""Bumped whenever what a key covers changes."""
SMALL_FILE_BYTES = 8 * 1024 * 1024
"""Files up to this size are hashed whole (configs, processor files, tokenizers); larger ones
(weights) by name, size and modification time, so binding a 100 GB checkpoint costs nothing."""
IDENTITY_FACTS = (
    "arch", "family", "model_dir", "hub", "layout", "architecture", "modalities",
    "hidden_size", "embedding_layout", "sample_rate", "device", "dtype",
)
"""The adapter's /server_info facts that identify what it computes (not counters or pids)."""


def content_digest(data: bytes | memoryview, verified_hash: str | None = None) -> bytes:
    """The 32-byte sha256 of an item's bytes; ``verified_hash`` (``sha256:<hex>``, already checked
    against ``data``) is used instead of hashing again."""
    if verified_hash is not None:
        return bytes.fromhex(verified_hash.removeprefix("sha256:"))
    return hashlib.sha256(data).digest()


def _file_facts(model_dir: Path) -> list[list[Any]]:
    facts: list[list[Any]] = []
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
                facts.append([rel, hashlib.sha256(path.read_bytes()).hexdigest()])
            else:
                facts.append([rel, stat.st_size, stat.st_mtime_ns])
    return facts


def model_namespace(model_info: Mapping[str, Any], settings: EncoderSettings) -> bytes:
    """The namespace of every key of one loaded model (see the module docstring).

    ``model_info`` is the adapter's ``info()``; its checkpoint directory is read for the file facts.
    """
    model_dir = model_info.get("model_dir")
    media = settings.media
    identity = {
        "format": KEY_FORMAT,
        "model": {k: model_info.get(k) for k in IDENTITY_FACTS},
        "files": _file_facts(Path(model_dir)) if isinstance(model_dir, str) and Path(model_dir).is_dir() else None,
        "tp_size": settings.parallel.tp_size,
        "processor": {
            "image_processor_use_gpu": settings.model.image_processor_use_gpu,
            "video": [media.video_fps, media.video_min_frames, media.video_max_frames],
        },
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).digest()


def item_key(namespace: bytes, modality: Modality, digest: bytes) -> bytes:
    """The cache key of one item: its content digest under a model namespace and modality."""
    return hashlib.sha256(namespace + modality.value.encode() + b"\0" + digest).digest()
