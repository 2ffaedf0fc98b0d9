"""Video decoding with PyAV: frame sampling at a rate within bounds, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

from encoder_pod.media.video import decode_video, plan_frames
from tests.support.media_files import audio_bytes, ffmpeg_audio_bytes, tone, video_bytes, video_frames

pytestmark = pytest.mark.unit

BIG = 10**8


@pytest.mark.parametrize(
    "total, native, fps, low, high, count",
    [
        (48, 24.0, 2.0, 2, 64, 4),  # 2 s at 2 fps
        (240, 24.0, 2.0, 2, 8, 8),  # 10 s wants 20, capped at max
        (12, 24.0, 2.0, 4, 64, 4),  # 0.5 s wants 1, raised to min
        (1, 24.0, 2.0, 2, 64, 2),  # a single frame: repeated up to min
        (30, 24.0, 2.0, 1, 64, 3),  # 2.5 frames round half up
        (100, 0.0, 2.0, 2, 64, 64),  # no native rate known: frames taken as at the sampling rate
    ],
)
def test_plan_respects_rate_and_bounds(total, native, fps, low, high, count):
    plan = plan_frames(total, native, fps, low, high)
    assert len(plan.indices) == count
    assert low <= len(plan.indices) <= high
    assert plan.indices == sorted(plan.indices) and 0 <= plan.indices[0] and plan.indices[-1] <= total - 1
    if total >= count:  # spread over the whole clip, first and last included, no repeats
        assert plan.indices[0] == 0 and plan.indices[-1] == total - 1 and len(set(plan.indices)) == count


def test_generated_clip_decodes_to_the_sampled_frames():
    data = video_bytes(48, 64, 48, fps=24, seed=3)
    clip = decode_video(data, fps=2.0, min_frames=2, max_frames=64, max_pixels=BIG)
    assert clip.frames.shape == (4, 48, 64, 3) and clip.frames.dtype == np.uint8
    assert clip.fps == pytest.approx(2.0)
    # Where the frames sit in the source travels with them (Qwen3-VL's prompt timestamps).
    assert clip.indices == (0, 16, 31, 47) and clip.source_fps == pytest.approx(24.0)
    assert clip.timestamps() == pytest.approx([0.0, 16 / 24, 31 / 24, 47 / 24])
    # The frames are the source frames at indices 0, 16, 31, 47 (within codec loss).
    source = video_frames(48, 64, 48, seed=3)
    for got, index in zip(clip.frames, plan_frames(48, 24.0, 2.0, 2, 64).indices):
        errors = [np.abs(got.astype(int) - frame.astype(int)).mean() for frame in source]
        assert int(np.argmin(errors)) == index


@pytest.mark.parametrize("low, high, seconds, expected", [(2, 3, 5.0, 3), (6, 64, 1.0, 6), (2, 64, 2.0, 4)])
def test_decoded_frame_count_respects_the_bounds(low, high, seconds, expected):
    data = video_bytes(int(seconds * 12), 32, 32, fps=12)
    clip = decode_video(data, fps=2.0, min_frames=low, max_frames=high, max_pixels=BIG)
    assert len(clip.frames) == expected


@pytest.mark.parametrize("codec, container", [("libvpx-vp9", "webm"), ("h264", "mp4")])
def test_other_codecs(codec, container):
    clip = decode_video(video_bytes(24, 64, 32, fps=12, codec=codec, container=container), 2.0, 2, 64, BIG)
    assert clip.frames.shape == (4, 32, 64, 3)


def _damaged() -> bytes:
    """Every 7th byte of the back two thirds overwritten (MP4 keeps its index, moov, at the end)."""
    data = bytearray(video_bytes(48, 64, 48, fps=24))
    for i in range(len(data) // 3, len(data), 7):
        data[i] = 0xFF
    return bytes(data)


def _half() -> bytes:
    data = video_bytes(48, 64, 48, fps=24)
    return data[: len(data) // 2]


@pytest.mark.parametrize(
    "data, words",
    [
        (b"", "empty item"),
        (b"this is text, not a video" * 8, "not a decodable video"),
        (_half(), "not a decodable video"),
        (_damaged(), "not a decodable video"),
        (audio_bytes(tone(0.5, 16000), 16000), "no video stream"),
        (ffmpeg_audio_bytes(tone(0.5, 16000), 16000), "no video stream"),
        (video_bytes(4, 128, 128, fps=4), "128x128 pixels .* above the limit of 10000 .*ENCODER_MAX_IMAGE_PIXELS"),
    ],
    ids=["empty", "text", "truncated", "damaged", "wav", "aac", "too many pixels"],
)
def test_bad_video_is_refused(data, words):
    with pytest.raises(ValueError, match=words):
        decode_video(data, 2.0, 2, 64, max_pixels=10_000)

