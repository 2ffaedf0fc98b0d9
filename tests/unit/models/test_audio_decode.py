"""Audio decoding: formats, mono down-mix, resampling accuracy, and the refusals users see."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from encoder_pod.media.audio import decode_audio
from tests.support.media_files import audio_bytes, ffmpeg_audio_bytes, tone

pytestmark = pytest.mark.unit

RATE = 16_000


def _rel_rms(got: np.ndarray, want: np.ndarray) -> float:
    n = min(got.size, want.size)
    return float(np.sqrt(np.mean((got[:n] - want[:n]) ** 2) / np.mean(want[:n] ** 2)))


@pytest.mark.parametrize("source_rate", [8_000, 22_050, 44_100, 48_000])
def test_resampled_audio_matches_the_signal_at_the_model_rate(source_rate):
    """The same analytic signal written at another rate decodes to the model-rate signal."""
    got = decode_audio(audio_bytes(tone(2.0, source_rate), source_rate), RATE, 600)
    want = tone(2.0, RATE)
    assert got.dtype == np.float32 and got.shape == want.shape
    # Measured: 6e-5 .. 2e-4 relative RMS (soxr HQ; the error sits at the clip edges, the
    # middle is within 5e-7). Unresampled 22.05 kHz samples would be a 38% time warp.
    assert _rel_rms(got, want) < 1e-3
    np.testing.assert_allclose(got[RATE // 10 : -RATE // 10], want[RATE // 10 : -RATE // 10], atol=1e-5)


def test_model_rate_audio_is_not_resampled():
    want = tone(1.0, 24_000)
    got = decode_audio(audio_bytes(want, 24_000), 24_000, 600)
    np.testing.assert_array_equal(got, want)


def test_audio_is_resampled_to_the_rate_asked_for():
    """The decoder takes the model's rate: a 24 kHz model gets 24 kHz samples, not 16 kHz."""
    data = audio_bytes(tone(1.5, 16_000), 16_000)
    assert decode_audio(data, 24_000, 600).size == 36_000
    assert decode_audio(data, 16_000, 600).size == 24_000


@pytest.mark.parametrize(
    "fmt, subtype, tolerance",
    # Lossy codecs are compared loosely: the point is that they decode to the right signal.
    [("WAV", "PCM_16", 1e-3), ("WAV", "FLOAT", 1e-3), ("FLAC", "PCM_24", 1e-3), ("OGG", "VORBIS", 0.05),
     ("OGG", "OPUS", 0.3), ("MP3", "MPEG_LAYER_III", 0.1)],
)
def test_formats_libsndfile_reads(fmt, subtype, tolerance):
    rate = 48_000 if subtype == "OPUS" else 44_100
    got = decode_audio(audio_bytes(tone(1.0, rate), rate, fmt, subtype), RATE, 600)
    assert abs(got.size - RATE) < RATE // 10  # mp3 adds encoder delay
    if fmt == "MP3":  # mp3's encoder delay shifts the signal: compare energy, not samples
        assert abs(np.sqrt(np.mean(got**2)) / np.sqrt(np.mean(tone(1.0, RATE) ** 2)) - 1) < tolerance
    else:
        assert _rel_rms(got, tone(1.0, RATE)) < tolerance


def test_formats_only_ffmpeg_reads():
    """AAC in MP4 is not a libsndfile format; it goes through PyAV."""
    got = decode_audio(ffmpeg_audio_bytes(tone(1.0, 44_100), 44_100), RATE, 600)
    assert abs(got.size - RATE) < 2048  # AAC priming samples
    assert 0.5 < np.sqrt(np.mean(got**2)) / np.sqrt(np.mean(tone(1.0, RATE) ** 2)) < 1.5


def test_channels_are_averaged_to_mono():
    left, right = tone(1.0, RATE, seed=1), tone(1.0, RATE, seed=2)
    got = decode_audio(audio_bytes(np.stack([left, right], axis=1), RATE), RATE, 600)
    np.testing.assert_allclose(got, (left + right) / 2, atol=1e-7)


def _pcm16_wav_with_frames(frames: int, rate: int = RATE) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x00\x00" * frames)
    return buf.getvalue()


def _nan_wav() -> bytes:
    samples = tone(0.5, RATE)
    samples[100] = np.nan
    return audio_bytes(samples, RATE)


@pytest.mark.parametrize(
    "data, words",
    [
        (b"", "empty item"),
        (b"definitely not an audio file, only some text bytes" * 4, "not decodable audio"),
        (_pcm16_wav_with_frames(0), "no samples"),
        (_nan_wav(), "NaN or infinite"),
        (audio_bytes(tone(3.0, RATE), RATE), "3.0s long, above the limit of 2.5s (ENCODER_MAX_AUDIO_SECONDS)"),
        (ffmpeg_audio_bytes(tone(3.0, RATE), RATE), "above the limit of 2.5s"),
    ],
    ids=["empty", "not audio", "zero samples", "nan", "too long", "too long via ffmpeg"],
)
def test_bad_audio_is_refused_with_the_reason(data, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        decode_audio(data, RATE, 2.5)

