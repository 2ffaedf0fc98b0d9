"""Log-mel features of audio items the way a family's own processor computes them.

The Qwen audio processors call the checkpoint's ``WhisperFeatureExtractor`` two ways:

- ``Qwen2AudioProcessor`` and ``Qwen2_5OmniProcessor``: ``padding="max_length"`` with the
  extractor's default truncation, i.e. every item becomes one 30 s window and longer audio is
  **cut to its first 30 s** (the language model gets 750 rows for any item of 30 s or more);
- ``Qwen3OmniMoeProcessor``: ``padding=True, truncation=False``: the whole item, any length.

:class:`AudioFrontEnd` does the same per item (so an item's features never depend on what else
is in the batch: with ``padding=True`` the last frame of a clip would depend on its neighbours),
and reports each item's valid mel-frame count: the item's grid on the wire, from which the
prefill side recomputes the placeholder count, as SGLang's own encoder sends it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from transformers import WhisperFeatureExtractor

from encoder_pod.errors import MediaError
from encoder_pod.modality import Modality
from encoder_pod.models.audio import resolve_sample_rate, sine
from encoder_pod.models.base import MediaItem

HEALTH_AUDIO_SECONDS = 0.2


class AudioFrontEnd:
    """The checkpoint's feature extractor at its resolved rate, called as the family's processor calls it."""

    def __init__(self, model_dir: Path, family: str, *, truncate: bool) -> None:
        self.rate, self.rate_source = resolve_sample_rate(model_dir, family)
        # Built from its config with the resolved rate: the mel filters and window follow the rate.
        config, _ = WhisperFeatureExtractor.get_feature_extractor_dict(model_dir)
        self.extractor = WhisperFeatureExtractor.from_dict({**config, "sampling_rate": self.rate})
        self.truncate = truncate

    @property
    def window_frames(self) -> int:
        """Mel frames of one padded window (3000 for 30 s)."""
        return int(self.extractor.nb_max_frames)

    def frames(self, samples: int) -> int:
        """Valid mel frames of an item of ``samples`` (the extractor's attention mask, computed alone)."""
        hop = int(self.extractor.hop_length)
        if self.truncate:
            return min(math.ceil(samples / hop), self.window_frames)
        return samples // hop  # one item alone: the STFT's trailing partial frame is dropped

    def features(self, waves: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_features (items, mel, frames), attention mask (items, frames)); items padded to one width.

        Each item is extracted alone (as a request holding only it would be), then zero-padded to the
        longest; the mask marks its valid frames, which is all the towers and their lengths read.
        """
        kwargs: dict[str, Any] = {"sampling_rate": self.rate, "return_attention_mask": True, "return_tensors": "pt"}
        if self.truncate:
            out = self.extractor(list(waves), padding="max_length", **kwargs)
            return out["input_features"], out["attention_mask"]
        singles = [self.extractor([w], padding=True, truncation=False, **kwargs) for w in waves]
        width = max(int(s["input_features"].shape[-1]) for s in singles)
        features = torch.zeros((len(singles), int(singles[0]["input_features"].shape[1]), width))
        mask = torch.zeros((len(singles), width), dtype=torch.long)
        for i, single in enumerate(singles):
            n = int(single["input_features"].shape[-1])
            features[i, :, :n] = single["input_features"][0]
            mask[i, :n] = single["attention_mask"][0]
        return features, mask

    def health_wave(self, seconds: float = HEALTH_AUDIO_SECONDS) -> np.ndarray:
        """A short tone at the model's rate."""
        return sine(seconds, self.rate)

    def info(self) -> dict[str, Any]:
        """Facts for /server_info."""
        return {
            "sample_rate_source": self.rate_source,
            "audio_longer_than_window": "truncated" if self.truncate else "kept",
            "window_seconds": self.extractor.n_samples / self.rate,
        }
