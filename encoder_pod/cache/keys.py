"""Cache keys: what makes two items the same item for this pod's model.

A key is ``sha256(namespace | modality | content digest)``:

- the **namespace** (:func:`model_namespace`) is computed once per loaded model from what
  determines its rows, as the adapter declares it (:class:`~encoder_pod.facts.ModelIdentity`:
  family, checkpoint class and layout, every checkpoint file: configs and processor files by
  content, weights by name, size and modification time; dtype and device), plus the pod's facts the adapter does not see: the tensor-parallel size (sharded
  reductions round differently) and the video sampling (what frames a clip becomes). Nothing
  ``/server_info`` only shows is in it, so a new display fact changes no key; two models never
  share a namespace, so the cache cannot hand one model's rows to another.
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
from dataclasses import asdict

from encoder_pod.facts import ModelIdentity
from encoder_pod.modality import Modality
from encoder_pod.settings import EncoderSettings

KEY_FORMAT = 2
"""Bumped whenever what a key covers changes (2: the adapter's declared identity, not its display facts)."""


def content_digest(data: bytes | memoryview, verified_hash: str | None = None) -> bytes:
    """The 32-byte sha256 of an item's bytes; ``verified_hash`` (``sha256:<hex>``, already checked
    against ``data``) is used instead of hashing again."""
    if verified_hash is not None:
        return bytes.fromhex(verified_hash.removeprefix("sha256:"))
    return hashlib.sha256(data).digest()


def model_namespace(identity: ModelIdentity, settings: EncoderSettings) -> bytes:
    """The namespace of every key of one loaded model (see the module docstring)."""
    media = settings.media
    declared = {
        "format": KEY_FORMAT,
        "model": asdict(identity),
        "tp_size": settings.parallel.tp_size,
        "video": [media.video_fps, media.video_min_frames, media.video_max_frames],
    }
    return hashlib.sha256(json.dumps(declared, sort_keys=True).encode()).digest()


def item_key(namespace: bytes, modality: Modality, digest: bytes) -> bytes:
    """The cache key of one item: its content digest under a model namespace and modality."""
    return hashlib.sha256(namespace + modality.value.encode() + b"\0" + digest).digest()
