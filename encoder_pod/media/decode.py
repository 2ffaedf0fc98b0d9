"""Decoding one item's bytes for the modality of its request."""

from __future__ import annotations

from encoder_pod.media.audio import decode_audio
from encoder_pod.media.images import decode_image
from encoder_pod.media.video import decode_video
from encoder_pod.modality import Modality
from encoder_pod.models.base import EncoderAdapter, MediaItem
from encoder_pod.errors import MediaError
from encoder_pod.settings import MediaSettings


def decode_item(modality: Modality, data: bytes, adapter: EncoderAdapter, media: MediaSettings) -> MediaItem:
    """A decoded :class:`MediaItem`; :class:`MediaError` says why the bytes cannot be used.

    Audio is resampled to the adapter's :attr:`~EncoderAdapter.sample_rate`, the rate resolved
    from the model's own configuration at load.
    """
    if modality is Modality.IMAGE:
        return MediaItem(modality, decode_image(data, media.max_image_pixels))
    if modality is Modality.AUDIO:
        if adapter.sample_rate is None:
            raise MediaError(f"{adapter.name} has no audio sample rate: it does not take AUDIO items")
        return MediaItem(modality, decode_audio(data, adapter.sample_rate, media.max_audio_seconds))
    if modality is Modality.VIDEO:
        clip = decode_video(
            data,
            fps=media.video_fps,
            min_frames=media.video_min_frames,
            max_frames=media.video_max_frames,
            max_pixels=media.max_image_pixels,
        )
        return MediaItem(modality, clip)
    raise MediaError(f"no decoder for {modality.value} items in this build")
