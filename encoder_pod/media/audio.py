"""Decoding audio bytes into a mono float32 waveform at the model's sample rate.

libsndfile (soundfile) reads wav, flac, ogg/opus and mp3; anything it does not recognise (aac,
m4a, webm ...) goes through FFmpeg (PyAV). Channels are averaged to mono, then the signal is
resampled with soxr to the rate the model was trained at: feeding 44.1 kHz samples to a 16 kHz
feature extractor would not fail, it would silently warp every frequency by 2.76x.
"""

from __future__ import annotations

import io

import av
import numpy as np
import soundfile as sf
import soxr

from encoder_pod.errors import MediaError

RESAMPLE_QUALITY = "HQ"
"""soxr's high quality (about -125 dB of aliasing, linear phase): resampling is a few ms per
minute of audio, far below the encoder's cost, so nothing cheaper is worth its error."""


def decode_audio(data: bytes, sample_rate: int, max_seconds: float) -> np.ndarray:
    """Mono float32 samples at ``sample_rate``; MediaError names why the bytes cannot be used.

    Refused: bytes that are no audio, zero samples, NaN or infinite samples, and audio longer than
    ``max_seconds`` (checked from the header before decoding where the header says).
    """
    if not data:
        raise MediaError("empty item (0 bytes)")
    try:
        samples, rate = _read_soundfile(data, max_seconds)
    except sf.SoundFileError:  # not a format libsndfile knows: FFmpeg may
        samples, rate = _read_ffmpeg(data, max_seconds)
    if samples.size == 0:
        raise MediaError("audio has no samples")
    _check_duration(samples.shape[0] / rate, max_seconds)
    if not np.isfinite(samples).all():
        raise MediaError("audio has NaN or infinite samples")
    mono = samples.mean(axis=1) if samples.ndim == 2 else samples
    if rate != sample_rate:
        mono = soxr.resample(mono, rate, sample_rate, quality=RESAMPLE_QUALITY)
    return np.ascontiguousarray(mono, dtype=np.float32)


def _check_duration(seconds: float, max_seconds: float) -> None:
    if seconds > max_seconds:
        raise MediaError(
            f"audio is {seconds:.1f}s long, above the limit of {max_seconds:g}s (ENCODER_MAX_AUDIO_SECONDS)"
        )


def _read_soundfile(data: bytes, max_seconds: float) -> tuple[np.ndarray, int]:
    """(frames, channels) float32 and the file's rate; LibsndfileError when not its format."""
    with sf.SoundFile(io.BytesIO(data)) as f:
        if f.samplerate <= 0:
            raise MediaError(f"audio header declares a sample rate of {f.samplerate} Hz")
        # The header's frame count is exact for wav/flac; for mp3/ogg it may be an estimate,
        # so the decoded length is checked again by the caller.
        if f.frames > 0:
            _check_duration(f.frames / f.samplerate, max_seconds)
        try:
            return f.read(dtype="float32", always_2d=True), f.samplerate
        except sf.LibsndfileError as exc:
            raise MediaError(f"audio data is corrupt or truncated ({exc})") from None


def _read_ffmpeg(data: bytes, max_seconds: float) -> tuple[np.ndarray, int]:
    """Any container/codec FFmpeg knows; decoding stops as soon as the limit is passed."""
    try:
        container = av.open(io.BytesIO(data), mode="r")
    except (av.FFmpegError, UnicodeDecodeError) as exc:
        raise MediaError(f"bytes are not decodable audio ({type(exc).__name__})") from None
    with container:
        if not container.streams.audio:
            raise MediaError("bytes are not decodable audio (no audio stream)")
        stream = container.streams.audio[0]
        rate = stream.rate or (stream.codec_context.sample_rate if stream.codec_context else 0)
        if not rate or rate <= 0:
            raise MediaError("audio stream declares no sample rate")
        # Planar float per channel, resampling left to soxr: FFmpeg's resampler is not used.
        to_float = av.AudioResampler(format="fltp", layout=stream.layout.name if stream.layout else None, rate=rate)
        chunks: list[np.ndarray] = []
        total = 0
        try:
            for frame in container.decode(stream):
                for out in to_float.resample(frame):
                    block = out.to_ndarray()  # (channels, n)
                    chunks.append(block.mean(axis=0))
                    total += block.shape[1]
                _check_duration(total / rate, max_seconds)
            for out in to_float.resample(None):  # flush
                block = out.to_ndarray()
                chunks.append(block.mean(axis=0))
        except av.FFmpegError as exc:
            raise MediaError(f"audio data is corrupt or truncated ({type(exc).__name__}: {exc})") from None
    samples = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
    return samples, rate
