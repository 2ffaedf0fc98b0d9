"""Decoding video bytes (PyAV, FFmpeg's own codecs) into frames sampled at a fixed rate.

Two passes over the bytes: the first only demuxes (no decoding) to count the frames, the second
decodes in order and keeps the sampled ones, so at most ``max_frames`` RGB frames are ever held,
however long the clip.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np

from encoder_pod.errors import MediaError

from encoder_pod.models.base import VideoClip


@dataclass(frozen=True)
class FramePlan:
    """Which decoded frames (by position in presentation order) become the clip."""

    indices: list[int]
    """Non-decreasing; a clip shorter than ``min_frames`` repeats frames."""
    fps: float
    """Sampled frames per second of source time."""
    source_fps: float = 0.0
    """The source's own frame rate (0 when the stream does not say)."""


def plan_frames(total: int, native_fps: float, fps: float, min_frames: int, max_frames: int) -> FramePlan:
    """Sample ``duration * fps`` frames, clamped to [min_frames, max_frames], spread evenly.

    Evenly spread over the whole clip (first and last frame included, like qwen-vl-utils), so
    the sampled frames cover the clip even when the clamp changes the effective rate.
    """
    if total < 1:
        raise MediaError("video has no frames")
    duration = total / native_fps if native_fps > 0 else total / fps
    wanted = math.floor(duration * fps + 0.5)  # half up, not banker's rounding
    count = min(max(wanted, min_frames), max_frames)
    indices = np.linspace(0, total - 1, count).round().astype(int).tolist()
    return FramePlan(indices=indices, fps=count / duration if duration > 0 else fps, source_fps=max(native_fps, 0.0))


def decode_video(data: bytes, fps: float, min_frames: int, max_frames: int, max_pixels: int) -> VideoClip:
    """RGB frames (T, H, W, 3) uint8 sampled per :func:`plan_frames`; MediaError says why not."""
    if not data:
        raise MediaError("empty item (0 bytes)")
    total, native_fps, size = _count_frames(data, max_pixels)
    plan = plan_frames(total, native_fps, fps, min_frames, max_frames)
    frames = _decode_at(data, plan.indices, size)
    # Source positions and rate travel with the clip: Qwen3-VL's prompt timestamps are computed from them.
    return VideoClip(frames=frames, fps=plan.fps, indices=tuple(plan.indices), source_fps=plan.source_fps or None)


def _open(data: bytes) -> av.container.InputContainer:
    try:
        return av.open(io.BytesIO(data), mode="r")
    except (av.FFmpegError, UnicodeDecodeError) as exc:
        raise MediaError(f"bytes are not a decodable video ({type(exc).__name__})") from None


def _video_stream(container: av.container.InputContainer) -> av.video.stream.VideoStream:
    if not container.streams.video:
        raise MediaError("bytes are not a decodable video (no video stream)")
    return container.streams.video[0]


def _count_frames(data: bytes, max_pixels: int) -> tuple[int, float, tuple[int, int]]:
    """(frames in the first video stream, its native fps, its (width, height)), from packets only."""
    with _open(data) as container:
        stream = _video_stream(container)
        width, height = stream.codec_context.width, stream.codec_context.height
        if width < 1 or height < 1:
            raise MediaError("bytes are not a decodable video (the stream declares no frame size)")
        if width * height > max_pixels:
            raise MediaError(
                f"video frames are {width}x{height} pixels ({width * height}), above the limit of "
                f"{max_pixels} (ENCODER_MAX_IMAGE_PIXELS)"
            )
        rate: Fraction | None = stream.average_rate or stream.guessed_rate
        try:
            total = sum(1 for packet in container.demux(stream) if packet.size)
        except av.FFmpegError as exc:
            raise MediaError(f"video data is corrupt ({type(exc).__name__}: {exc})") from None
    return total, float(rate) if rate else 0.0, (width, height)


def _decode_at(data: bytes, indices: list[int], size: tuple[int, int]) -> np.ndarray:
    """Decode in order and keep the frames at ``indices`` (repeats allowed), all at ``size``.

    A stream may change resolution mid-way; every frame is converted to the size its header
    declared (and was checked against the pixel limit), so the clip is one array.
    """
    width, height = size

    def rgb(frame: av.VideoFrame) -> np.ndarray:
        return frame.to_ndarray(format="rgb24", width=width, height=height)

    wanted: dict[int, int] = {}
    for index in indices:
        wanted[index] = wanted.get(index, 0) + 1
    kept: list[np.ndarray] = []
    latest: av.VideoFrame | None = None
    with _open(data) as container:
        stream = _video_stream(container)
        stream.thread_type = "AUTO"
        try:
            for position, frame in enumerate(container.decode(stream)):
                latest = frame
                if position in wanted:
                    kept.extend([rgb(frame)] * wanted[position])
                if position >= indices[-1]:
                    break
        except av.FFmpegError as exc:
            raise MediaError(f"video data is corrupt ({type(exc).__name__}: {exc})") from None
    if latest is None:
        raise MediaError("video data is corrupt (no frame could be decoded)")
    if len(kept) < len(indices):
        # More packets than decodable frames (a damaged tail): the missing samples repeat the
        # last decoded frame rather than shrink the clip below min_frames.
        kept.extend([rgb(latest)] * (len(indices) - len(kept)))
    return np.stack(kept)
