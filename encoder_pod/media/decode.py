"""Decoding one item's bytes for the modality of its request."""

from __future__ import annotations

from encoder_pod.modality import Modality
from encoder_pod.models.base import EncoderAdapter, MediaItem
from encoder_pod.settings import EncoderSettings

from encoder_pod.media.images import decode_image


def decode_item(modality: Modality, data: bytes, adapter: EncoderAdapter, settings: EncoderSettings) -> MediaItem:
    """A decoded :class:`MediaItem`; ValueError says why the bytes cannot be used."""
    if modality is Modality.IMAGE:
        return MediaItem(modality, decode_image(data, settings.max_image_pixels))
    raise ValueError(f"no decoder for {modality.value} items in this build")
