"""The identifier vLLM 0.34.0 gives a media item: the client's uuid, or its ``mm_hash``.

A vLLM consumer looks an item's embedding up by ``MultiModalFeatureSpec.identifier``. For a
request that carries no request-level ``mm_processor_kwargs``/``media_io_kwargs`` it is the
content part's ``uuid`` verbatim; otherwise (or when the part has no uuid) it is a digest, by
``--mm-hasher-algorithm`` (blake3 by default, sha256 or sha512), over these keyword arguments in
sorted key order:

- ``model_id``: the ``--model`` string the consumer was started with (not its served name);
- ``<modality>``: the item: the uuid when one was given, else, for an image, a leaf that nests
  one more ``image`` key over the original file bytes (over ``{"io_config": {...}, "data":
  bytes}`` when decoding changed the image's mode), or that is the 16 bytes of an EXIF
  ``ImageID`` held as a UUID object (which Pillow never makes of a file's own EXIF, a string);
- ``media_io_kwargs``: ``{<modality>: the request's media_io_kwargs for it}``, when non-empty;
- ``mm_processor_kwargs``: the request's processor kwargs minus the other modalities'
  ``*_kwargs``, when non-empty.

The byte stream is this module's own writing of the framing vLLM's ``MultiModalHasher`` uses
(tests compare it with the hasher.py of the released wheel): every chunk is preceded by its
length (8 bytes, little-endian); a key is one framed chunk, its value is tagged: ``\\x00`` None,
``\\x01`` + count for a list or tuple, ``\\x02`` + count for a mapping (each key framed as text,
in the mapping's own order), ``\\x03`` + one framed chunk for a leaf (text as UTF-8, bytes as they
are, an int or float as numpy writes a 0-d int64/float64/bool array).

Audio is hashed by vLLM after resampling, as an array of samples; video by its decoded frames or
bytes plus loader metadata, and Qwen3-VL rehashes videos with per-video options: those items need
a uuid here (:func:`needs_uuid`).
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Iterator, Mapping

import numpy as np

ALGORITHMS: tuple[str, ...] = ("blake3", "sha256", "sha512")

MODALITY_KWARGS = {"image": "images_kwargs", "video": "videos_kwargs", "audio": "audio_kwargs"}
"""Processor kwargs scoped to one modality: another modality's entry is not a factor of an item."""

_NONE, _SEQUENCE, _MAPPING, _LEAF = b"\x00", b"\x01", b"\x02", b"\x03"


def _length(n: int) -> bytes:
    return n.to_bytes(8, "little")


def _framed(chunk: bytes) -> Iterator[bytes]:
    yield _length(len(chunk))
    yield chunk


def _leaf(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bool, int, float)):
        return np.array(value).tobytes()
    raise TypeError(f"no vLLM hash encoding for a {type(value).__name__} value")


def _value(value: Any) -> Iterator[bytes]:
    if value is None:
        yield _NONE
    elif isinstance(value, (list, tuple)):
        yield _SEQUENCE + _length(len(value))
        for element in value:
            yield from _value(element)
    elif isinstance(value, Mapping):
        yield _MAPPING + _length(len(value))
        for key, element in value.items():
            yield from _framed(str(key).encode("utf-8"))
            yield from _value(element)
    elif isinstance(value, ImageBytes):
        yield _LEAF
        yield from value.chunks()
    else:
        yield _LEAF
        yield from _framed(_leaf(value))


def _hasher(algorithm: str) -> Any:
    if algorithm == "blake3":
        from blake3 import blake3

        return blake3()
    if algorithm in ("sha256", "sha512"):
        return hashlib.new(algorithm)
    raise ValueError(f"unknown hash algorithm {algorithm!r} (vLLM's --mm-hasher-algorithm takes {', '.join(ALGORITHMS)})")


def hash_kwargs(algorithm: str, **kwargs: Any) -> str:
    """The hex digest vLLM's ``MultiModalHasher.hash_kwargs(algorithm, **kwargs)`` computes."""
    hasher = _hasher(algorithm)
    update: Callable[[bytes], None] = hasher.update
    for key in sorted(kwargs):
        for chunk in _framed(key.encode("utf-8")):
            update(chunk)
        for chunk in _value(kwargs[key]):
            update(chunk)
    return str(hasher.hexdigest())


class ImageBytes:
    """An image item as vLLM hashes it: the file's bytes, and what decoding them did.

    ``io_config`` is set when vLLM's decode changed the image's mode (``{"image_mode": "RGB",
    "rgba_background_color": (r, g, b)}``, in that order); ``image_id`` is the 16 bytes of an EXIF
    ``ImageID`` UUID, which then stands for the whole image.
    """

    __slots__ = ("data", "io_config", "image_id")

    def __init__(self, data: bytes, io_config: dict[str, Any] | None = None, image_id: bytes | None = None) -> None:
        self.data = data
        self.io_config = io_config
        self.image_id = image_id

    def chunks(self) -> Iterator[bytes]:
        """The image's leaf: its EXIF ImageID alone, else a nested ``image`` key whose value is the
        bytes, or ``{"io_config": ..., "data": bytes}`` when decoding converted the image."""
        if self.image_id is not None:
            yield from _framed(self.image_id)
            return
        yield from _framed(b"image")
        yield from _value({"io_config": self.io_config, "data": self.data} if self.io_config else self.data)


def hash_factors(
    modality: str, mm_processor_kwargs: Mapping[str, Any] | None, media_io_kwargs: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, Any]:
    """The request-level kwargs that are factors of an item of ``modality`` (empty ones left out)."""
    media = dict((media_io_kwargs or {}).get(modality) or {})
    scoped = MODALITY_KWARGS.get(modality)
    processor = {
        key: value
        for key, value in (mm_processor_kwargs or {}).items()
        if key not in MODALITY_KWARGS.values() or key == scoped
    }
    factors: dict[str, Any] = {}
    if media:
        factors["media_io_kwargs"] = {modality: media}
    if processor:
        factors["mm_processor_kwargs"] = processor
    return factors


def needs_uuid(modality: str) -> str | None:
    """Why vLLM's content hash of an item of ``modality`` cannot be reproduced here (None: it can)."""
    if modality == "audio":
        return "vLLM hashes audio after resampling it to the model's rate, as an array of samples"
    if modality == "video":
        return "vLLM hashes video by its decoded frames or bytes with loader metadata (Qwen3-VL also per-video options)"
    return None


def identifier(
    algorithm: str,
    model_id: str,
    modality: str,
    uuid: str | None,
    item: ImageBytes | None,
    factors: Mapping[str, Any],
) -> str:
    """The identifier a vLLM consumer looks the item up by.

    ``uuid`` verbatim when given and there are no ``factors``; otherwise the digest of the uuid
    (or, without one, of ``item``), ``model_id`` and ``factors``.
    """
    if uuid is not None and not factors:
        return uuid
    if uuid is not None:
        value: Any = uuid
    elif item is not None:
        value = item
    else:
        raise ValueError(f"a {modality} item without a uuid has no identifier here: {needs_uuid(modality)}")
    return hash_kwargs(algorithm, model_id=model_id, **{modality: value}, **factors)
