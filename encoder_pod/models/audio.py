"""What every Whisper-style audio adapter shares: the sample rate, 30 s windows and valid-frame rows.

Whisper-style encoders take log-mel features padded to a fixed window (30 s: 3000 mel frames)
and always emit the full window's rows (1500). Only the rows computed from real audio are served:
an item of ``L`` valid mel frames (the feature extractor's attention mask) gives ``rows(L)`` rows,
counted per family. Audio longer than one window is, per family (``max_windows``), either cut into
consecutive windows each encoded on its own (Whisper, as its long-form mode does), or cut to its
first window as the family's processor does (Qwen2-Audio: 30 s at most). An item's grid is one
number: its valid mel frames, all windows together.
"""

from __future__ import annotations

import json
import logging
import math
import zlib
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np
import torch
from transformers import WhisperFeatureExtractor

from encoder_pod.errors import MediaError
from encoder_pod.modality import Modality
from encoder_pod.models.base import BaseAdapter, MediaItem, PreparedBatch, check_loading_info
from encoder_pod.models.vision import check_preset, randomize, regroup, save_atomically
from encoder_pod.models.weights import whole_checkpoint_report

log = logging.getLogger(__name__)

DEFAULT_SAMPLE_RATE = 16_000
"""Used only when no configuration file of the checkpoint names a rate (with a warning)."""

SAMPLE_RATE_BOUNDS = (1_000, 384_000)

HEALTH_AUDIO_SECONDS = 0.010


def _rate_in(source: dict[str, Any], keys: Sequence[str]) -> Any:
    """The first ``sampling_rate`` found at the top of ``source`` or in one of its sub-dicts ``keys``."""
    if "sampling_rate" in source:
        return source["sampling_rate"]
    for key in keys:
        nested = source.get(key)
        if isinstance(nested, dict) and "sampling_rate" in nested:
            return nested["sampling_rate"]
    return None


# (file, sub-dicts searched after the top level), in the order they are trusted.
_RATE_SOURCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("preprocessor_config.json", ()),  # the feature extractor: what it was built for
    ("processor_config.json", ("feature_extractor", "audio_processor")),
    ("config.json", ("audio_config", "audio_encoder_config")),
)



def check_wave(item: MediaItem) -> np.ndarray:
    """The samples of an AUDIO item; :class:`MediaError` when they cannot be encoded."""
    if item.modality is not Modality.AUDIO:
        raise MediaError(f"this model encodes AUDIO items, not {item.modality.value}")
    wave = item.data
    if not isinstance(wave, np.ndarray) or wave.ndim != 1:
        raise MediaError("an AUDIO item must be a decoded mono waveform")
    if wave.size == 0:
        raise MediaError("audio has no samples")
    if not np.isfinite(wave).all():
        raise MediaError("audio has NaN or infinite samples")
    return wave

def resolve_sample_rate(model_dir: Path, model_name: str) -> tuple[int, str]:
    """(rate in Hz, the file that said so) for a checkpoint; 16 kHz with a warning if none does.

    Read from the raw JSON, not the loaded feature extractor: a feature extractor class has a
    default ``sampling_rate`` of its own, which would hide that the checkpoint never said.
    """
    for filename, nested in _RATE_SOURCES:
        path = Path(model_dir) / filename
        if not path.is_file():
            continue
        value = _rate_in(json.loads(path.read_text()), nested)
        if value is None:
            continue
        low, high = SAMPLE_RATE_BOUNDS
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high or value != int(value):
            raise RuntimeError(f"{path}: sampling_rate {value!r} is not a whole number of Hz in {low}..{high}")
        return int(value), filename
    log.warning(
        "%s model in %s names no sampling_rate (preprocessor_config.json, processor_config.json, config.json); "
        "assuming %d Hz: audio at another rate will be warped",
        model_name,
        model_dir,
        DEFAULT_SAMPLE_RATE,
    )
    return DEFAULT_SAMPLE_RATE, "default"


def sine(seconds: float, rate: int, freq: float = 440.0) -> np.ndarray:
    """A float32 sine: deterministic, not silence, valid for every audio model."""
    t = np.arange(max(1, int(round(seconds * rate)))) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


class AudioAdapter(BaseAdapter):
    """A Whisper-style tower with a ``WhisperFeatureExtractor``; subclasses count rows and run it."""

    modalities: ClassVar[frozenset[Modality]] = frozenset({Modality.AUDIO})
    model_cls: ClassVar[type[Any]]
    config_cls: ClassVar[type]
    presets: ClassVar[dict[str, dict[str, Any]]]
    """Tower sizes of the tiny checkpoints (:func:`write_tiny`)."""
    max_windows: ClassVar[int | None] = None
    """Windows encoded per item; audio past them is dropped, as the family's processor drops it (None: all)."""

    model: Any
    feature_extractor: WhisperFeatureExtractor
    _rate: int
    _rate_source: str

    # --- family specifics -------------------------------------------------------------------
    @staticmethod
    def rows_for_frames(frames: int) -> int:
        """Output rows computed from ``frames`` valid mel frames of one window."""
        raise NotImplementedError

    def _encode(self, features: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
        """(windows, mel, window frames) -> (windows, rows per full window, hidden)."""
        raise NotImplementedError

    # --- construction -----------------------------------------------------------------------
    def load(self) -> None:
        """Resolve the sample rate, build the feature extractor for it, load the tower strictly."""
        self._rate, self._rate_source = resolve_sample_rate(self.model_dir, self.name)
        # Built from its config with the resolved rate: a rate found only in config.json must
        # build the mel filters and the window for that rate. (from_pretrained(sampling_rate=...)
        # would only set the attribute after __init__ derived both from the class default.)
        config, _ = WhisperFeatureExtractor.get_feature_extractor_dict(self.model_dir)
        self.feature_extractor = WhisperFeatureExtractor.from_dict({**config, "sampling_rate": self._rate})
        self.model = self._load_model()
        self._check_extractor()
        log.info("%s expects %d Hz audio (from %s)", self.name, self._rate, self._rate_source)

    def _load_model(self) -> Any:
        """The tower saved on its own, strictly (``from_pretrained``)."""
        model, info = self.model_cls.from_pretrained(self.model_dir, dtype=self.dtype, output_loading_info=True)
        check_loading_info(self.model_cls.__name__, info)
        self.weights = whole_checkpoint_report(self.model_dir)
        return model.to(self.device).eval()

    def _check_extractor(self) -> None:
        """The features must have the tower's mel bins and exactly its window length."""
        config, fe = self.model.config, self.feature_extractor
        window = config.max_source_positions * self.model.conv1.stride[0] * self.model.conv2.stride[0]
        problems = []
        if fe.feature_size != config.num_mel_bins:
            problems.append(f"feature_size {fe.feature_size} vs num_mel_bins {config.num_mel_bins}")
        if fe.nb_max_frames != window:
            problems.append(f"{fe.nb_max_frames} mel frames per window vs {window} the tower takes")
        if problems:
            raise RuntimeError(f"preprocessor_config.json does not fit the tower in {self.model_dir}: {'; '.join(problems)}")

    # --- per item ---------------------------------------------------------------------------
    def _windows(self, samples: int) -> list[tuple[int, int, int]]:
        """(start, end, rows) per window of an item; a trailing sliver too short for a row is dropped."""
        size, hop = self.feature_extractor.n_samples, self.feature_extractor.hop_length
        windows = []
        stop = samples if self.max_windows is None else min(samples, self.max_windows * size)
        for start in range(0, stop, size):
            end = min(start + size, stop)
            # The extractor's attention mask marks ceil(samples / hop) frames valid.
            rows = self.rows_for_frames(math.ceil((end - start) / hop))
            if rows > 0:
                windows.append((start, end, rows))
        return windows

    def measure(self, item: MediaItem) -> int:
        """Rows from the valid frames of every window; :class:`MediaError` for audio the model cannot take."""
        wave = check_wave(item)
        rows = sum(r for _, _, r in self._windows(wave.size))
        if rows == 0:
            raise MediaError(
                f"audio is {1000 * wave.size / self._rate:.1f} ms long: too short for one output row "
                f"(at least {1000 * self.min_samples / self._rate:.1f} ms)"
            )
        return rows

    @property
    def min_samples(self) -> int:
        """Fewest samples that give one output row."""
        hop, frames = self.feature_extractor.hop_length, 1
        while self.rows_for_frames(frames) < 1:
            frames += 1
        return (frames - 1) * hop + 1

    # --- per batch --------------------------------------------------------------------------
    def preprocess(self, requests: Sequence[Sequence[MediaItem]]) -> PreparedBatch:
        """ONE feature-extractor call over every window of every item (each padded to the window)."""
        items = [item for reqs in requests for item in reqs]
        if not items:
            raise ValueError("a batch needs at least one item")
        chunks, owners = [], []
        for index, item in enumerate(items):
            for start, end, _ in self._windows(item.data.size):
                chunks.append(item.data[start:end])
                owners.append(index)
        out = self.feature_extractor(
            chunks,
            sampling_rate=self._rate,
            padding="max_length",
            return_attention_mask=True,
            return_tensors="pt",
        )
        frames = out["attention_mask"].sum(-1)
        # Rows from the mask the extractor really produced: the slicing plan follows the data.
        window_rows = [self.rows_for_frames(int(f)) for f in frames]
        item_rows, item_frames = [0] * len(items), [0] * len(items)
        for owner, rows, count in zip(owners, window_rows, frames.tolist()):
            item_rows[owner] += rows
            item_frames[owner] += int(count)
        return PreparedBatch(
            inputs={"input_features": out["input_features"], "frames": frames},
            item_tokens=regroup(item_rows, requests),
            # One length per item, the raw mel-frame count: what SGLang's encoder sends for audio.
            item_grids=regroup([[n] for n in item_frames], requests),
            extra={"window_rows": window_rows},
        )

    def forward(self, batch: PreparedBatch) -> torch.Tensor:
        """One tower forward over all windows; keeps each window's valid rows, in item order."""
        with torch.inference_mode():
            features = batch.inputs["input_features"].to(self.device, self.dtype)
            hidden = self._encode(features, batch.inputs["frames"].to(self.device))
            return torch.cat([hidden[i, :rows] for i, rows in enumerate(batch.extra["window_rows"])])

    # --- facts ------------------------------------------------------------------------------
    def health_item(self, modality: Modality) -> MediaItem:
        """10 ms of a 440 Hz tone at the model's rate (longer only if the family needs it for one row)."""
        if modality not in self.modalities:
            raise ValueError(f"{self.name} has no {modality.value} health item")
        samples = max(int(round(HEALTH_AUDIO_SECONDS * self._rate)), self.min_samples)
        return MediaItem(Modality.AUDIO, sine(samples / self._rate, self._rate))

    @property
    def sample_rate(self) -> int | None:
        """The rate audio is resampled to before feature extraction (resolved at load)."""
        return self._rate

    @property
    def hidden_size(self) -> int:
        """Width of one output row (the tower's d_model)."""
        return int(self.model.config.d_model)

    def info(self) -> dict[str, Any]:
        """Base facts plus where the sample rate came from and the window length."""
        return {
            **super().info(),
            "sample_rate_source": self._rate_source,
            "window_seconds": self.feature_extractor.n_samples / self._rate,
            "audio_longer_than_window": "windows" if self.max_windows is None else "truncated",
        }


def write_tiny(adapter: type[AudioAdapter], out: Path, preset: str = "tiny") -> None:
    """Seeded random ``adapter`` tower plus a 16 kHz ``WhisperFeatureExtractor`` config, written offline."""
    check_preset(preset)
    config = adapter.config_cls(**adapter.presets[preset])
    model = adapter.model_cls(config)
    randomize(model, seed=zlib.crc32(adapter.name.encode()))
    extractor = WhisperFeatureExtractor(feature_size=config.num_mel_bins, sampling_rate=DEFAULT_SAMPLE_RATE)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        extractor.save_pretrained(tmp)

    save_atomically(out, write)
