"""Deterministic audio and video files for tests, written with the same libraries the pod reads.

Signals are evaluated analytically at each sample rate (never resampled here), so a test that
compares rates compares the pod's resampling against the true signal.
"""

from __future__ import annotations

import base64
import io

import av
import numpy as np
import soundfile as sf

# Partials well below 4 kHz (the Nyquist frequency of 8 kHz audio), so every rate tested can
# represent the same signal; soxr's passband ends near 0.91 of Nyquist.
_PARTIALS = ((220.0, 0.30), (523.0, 0.20), (1250.0, 0.15), (2600.0, 0.10))
_FADE_S = 0.02


def tone(seconds: float, rate: int, seed: int = 0) -> np.ndarray:
    """A band-limited chord with a slow tremolo and 20 ms fades, float32 in [-1, 1].

    ``seed`` shifts phases and tremolo, so different seeds give clearly different audio.
    """
    t = np.arange(int(round(seconds * rate))) / rate
    phases = np.random.default_rng(seed).uniform(0, 2 * np.pi, len(_PARTIALS) + 1)
    signal = sum(amp * np.sin(2 * np.pi * freq * t + ph) for (freq, amp), ph in zip(_PARTIALS, phases))
    signal = signal * (0.75 + 0.25 * np.sin(2 * np.pi * 3.0 * t + phases[-1]))
    fade = np.clip(np.minimum(t, t[-1] - t) / _FADE_S, 0, 1) if t.size else t
    return (signal * fade).astype(np.float32)


def audio_bytes(samples: np.ndarray, rate: int, fmt: str = "WAV", subtype: str | None = "FLOAT") -> bytes:
    """``samples`` ((n,) or (n, channels)) encoded by libsndfile: WAV, FLAC, OGG, MP3 ..."""
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def ffmpeg_audio_bytes(samples: np.ndarray, rate: int, container: str = "mp4", codec: str = "aac") -> bytes:
    """Mono ``samples`` encoded by FFmpeg (formats libsndfile does not read, e.g. AAC in MP4)."""
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples.astype(np.float32)[None, :], format="flt", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def video_frames(count: int, width: int, height: int, seed: int = 0) -> np.ndarray:
    """(count, height, width, 3) uint8: a moving gradient plus per-clip noise (frames differ)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    ramp = np.linspace(0, 255, width, dtype=np.float32)
    frames = []
    for i in range(count):
        frame = base.astype(np.float32) * 0.5
        frame[:, :, i % 3] += np.roll(ramp, 7 * i)[None, :] * 0.5
        frames.append(frame.clip(0, 255).astype(np.uint8))
    return np.stack(frames)


def video_bytes(count: int, width: int, height: int, fps: int = 24, seed: int = 0, codec: str = "mpeg4",
                container: str = "mp4") -> bytes:
    """A clip of :func:`video_frames` encoded by FFmpeg (PyAV)."""
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for frame in video_frames(count, width, height, seed):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def data_uri(data: bytes, mime: str) -> str:
    """``data:<mime>;base64,...``"""
    return f"data:{mime};base64," + base64.b64encode(data).decode()
