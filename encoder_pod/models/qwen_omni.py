"""Qwen2.5-Omni and Qwen3-Omni: the thinker's vision and audio towers, out of the whole checkpoint.

Only ``thinker.model.visual`` and ``thinker.model.audio_tower`` (hub keys ``thinker.visual.*`` and
``thinker.audio_tower.*``) are built and read; the thinker's language model, the talker and the
speech decoder (``token2wav`` / ``code2wav``) never are. One pod serves IMAGE, VIDEO and AUDIO:

- images and video: as Qwen2.5-VL (2.5-Omni) or with Qwen3-VL's deepstack layout (3-Omni); both
  size video per frame (their processors use ``Qwen2VLVideoProcessor``) and send
  ``second_per_grid_ts`` per video item.
- audio: the thinker's own ``get_audio_features`` on the audio tower alone (its projection to the
  language model's width included). Features as the family's processor makes them
  (:class:`~encoder_pod.models.audio_front.AudioFrontEnd`): 2.5-Omni pads to and keeps 30 s,
  3-Omni keeps the whole item. Rows per item are the tower's own output lengths.

Qwen3-Omni's audio tower pads every 100-frame chunk of a batch to the longest chunk and its convs
see that padding, so a clip shorter than one chunk would get other rows batched beside a longer
clip than alone. Clips run together only when they share that chunk length, which keeps every
item's rows independent of the batch.

Why an adapter, not the generic path (:mod:`~encoder_pod.models.generic`): the whole
``...OmniForConditionalGeneration`` has no feature method (only its thinker has), the generic
path serves images only, and this family is three modalities in one pod: audio windows as
each processor cuts them (above), video without torchvision, Qwen3-Omni's deepstack layout.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Sequence

import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniForConditionalGeneration,
    Qwen2_5OmniThinkerModel,
)
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as qwen3_omni

from encoder_pod.errors import MediaError
from encoder_pod.modality import Modality
from encoder_pod.models.audio import check_wave
from encoder_pod.models.audio_front import AudioFrontEnd
from encoder_pod.models.base import MediaItem, PreparedBatch
from encoder_pod.models.parts import FullLayout, host_class
from encoder_pod.models.qwen_vision import QwenVisionAdapter, VideoTiming
from encoder_pod.models.vision import regroup

VISION, AUDIO = "thinker.model.visual", "thinker.model.audio_tower"


class _OmniAdapter(FullLayout, QwenVisionAdapter):
    """The thinker's vision tower (images, video) and audio tower (audio) of an Omni checkpoint."""

    modalities: ClassVar[frozenset[Modality]] = frozenset({Modality.IMAGE, Modality.VIDEO, Modality.AUDIO})
    timing = VideoTiming.SECOND_PER_GRID
    hidden_attr = "out_hidden_size"
    truncate_audio: ClassVar[bool]
    audio_method: ClassVar[Callable[..., Any]]
    """The thinker model's (unbound) ``get_audio_features``."""

    audio_host: Any  # a Host: transformers modules type their children loosely
    audio: AudioFrontEnd

    @classmethod
    def part_paths(cls, checkpoint: Any) -> tuple[str, ...]:
        return (VISION, AUDIO)

    def _load_tower(self) -> Any:
        full = self.open_checkpoint()
        vision, audio = full.build_like(VISION, self.dtype), full.build_like(AUDIO, self.dtype)
        self.weights = full.load({VISION: vision, AUDIO: audio})
        host_cls = host_class(f"{type(self).__name__}AudioHost", get_audio_features=type(self).audio_method)
        self.audio_host = host_cls(full.config.thinker_config, audio_tower=audio).to(self.device).eval()
        self.audio = AudioFrontEnd(self.model_dir, self.name, truncate=self.truncate_audio)
        return vision.to(self.device).eval()

    def encoder_modules(self) -> list[Any]:
        """Both towers."""
        return [self.model, self.audio_host.audio_tower]

    # --- audio ------------------------------------------------------------------------------------
    def audio_rows(self, frames: int) -> int:
        """The audio tower's own output length for ``frames`` valid mel frames."""
        raise NotImplementedError

    def measure(self, item: MediaItem) -> int:
        """Rows of an image, a clip, or an audio item."""
        if item.modality is not Modality.AUDIO:
            return super().measure(item)
        wave = check_wave(item)
        frames = self.audio.frames(wave.size)
        rows = self.audio_rows(frames) if frames > 0 else 0
        if rows < 1:
            raise MediaError(f"audio is {1000 * wave.size / self.audio.rate:.1f} ms long: too short for one output row")
        return rows

    def preprocess(self, requests: Sequence[Sequence[MediaItem]]) -> PreparedBatch:
        """Audio: one feature extraction per item, grouped for the forward; else as the vision path."""
        if not any(item.modality is Modality.AUDIO for items in requests for item in items):
            return super().preprocess(requests)
        waves = [item.data for items in requests for item in items]
        features, mask = self.audio.features(waves)
        frames = [int(n) for n in mask.sum(-1)]
        return PreparedBatch(
            inputs={"input_features": features, "feature_attention_mask": mask},
            item_tokens=regroup([self.audio_rows(n) for n in frames], requests),
            item_grids=regroup([[n] for n in frames], requests),
            extra={"modality": Modality.AUDIO, "groups": self.audio_groups(frames)},
        )

    def audio_groups(self, frames: Sequence[int]) -> list[list[int]]:
        """Items (by index) that may share a tower call without changing each other's rows."""
        return [list(range(len(frames)))]

    def forward(self, batch: PreparedBatch) -> torch.Tensor:
        """The vision tower, or the thinker's ``get_audio_features`` per group, rows in item order."""
        if batch.extra.get("modality") is not Modality.AUDIO:
            return super().forward(batch)
        features = batch.inputs["input_features"].to(self.device, self.dtype)
        mask = batch.inputs["feature_attention_mask"].to(self.device)
        rows: dict[int, torch.Tensor] = {}
        with torch.inference_mode():
            for group in batch.extra["groups"]:
                index = torch.tensor(group, device=self.device)
                width = int(mask[index].sum(-1).max())
                out = self.audio_host.get_audio_features(features[index][..., :width], mask[index][:, :width])
                counts = [self.audio_rows(int(mask[i].sum())) for i in group]
                for i, part in zip(group, torch.split(out.last_hidden_state, counts)):
                    rows[i] = part
        return torch.cat([rows[i] for i in range(len(rows))])

    def health_item(self, modality: Modality) -> MediaItem:
        """A short tone for AUDIO; an image or clip otherwise."""
        if modality is Modality.AUDIO:
            return MediaItem(Modality.AUDIO, self.audio.health_wave())
        return super().health_item(modality)

    @property
    def sample_rate(self) -> int | None:
        """The rate audio is resampled to (resolved from the checkpoint at load)."""
        return self.audio.rate

    @property
    def audio_width(self) -> int:
        """Width of an audio row (the audio tower's projection: the language model's width)."""
        return int(self.audio_host.audio_tower.config.output_dim)

    def info(self) -> dict[str, Any]:
        """Vision facts, plus the audio rows' width and how long audio is handled."""
        return {**super().info(), "audio_width": self.audio_width, **self.audio.info()}


class Qwen25OmniAdapter(_OmniAdapter):
    """Qwen2.5-Omni (``Qwen2_5OmniForConditionalGeneration``): Qwen2.5-VL's tower, a Whisper-like audio tower."""

    name = "qwen2_5_omni"
    full_classes = {"Qwen2_5OmniForConditionalGeneration": Qwen2_5OmniForConditionalGeneration}
    truncate_audio = True
    audio_method = Qwen2_5OmniThinkerModel.get_audio_features

    def audio_rows(self, frames: int) -> int:
        """conv stride 2, then pool stride 2 (``Qwen2_5OmniAudioEncoder._get_feat_extract_output_lengths``)."""
        _, rows = self.audio_host.audio_tower._get_feat_extract_output_lengths(torch.tensor([frames]))
        return int(rows[0])


class Qwen3OmniAdapter(_OmniAdapter):
    """Qwen3-Omni (``Qwen3OmniMoeForConditionalGeneration``): deepstack vision tower, chunked audio tower."""

    name = "qwen3_omni"
    full_classes = {"Qwen3OmniMoeForConditionalGeneration": qwen3_omni.Qwen3OmniMoeForConditionalGeneration}
    truncate_audio = False
    audio_method = qwen3_omni.Qwen3OmniMoeThinkerModel.get_audio_features

    @property
    def chunk(self) -> int:
        """Mel frames per audio chunk (``n_window * 2``)."""
        return 2 * int(self.audio_host.audio_tower.config.n_window)

    def audio_rows(self, frames: int) -> int:
        """The chunked conv stack's output length (the processor's and the tower's rule)."""
        n_window = int(self.audio_host.audio_tower.config.n_window)
        return int(qwen3_omni._get_feat_extract_output_lengths(torch.tensor([frames]), n_window=n_window)[0])

    def audio_groups(self, frames: Sequence[int]) -> list[list[int]]:
        """Items whose longest chunk is the same: every clip of a chunk or more, and equal short clips."""
        groups: dict[int, list[int]] = {}
        for index, count in enumerate(frames):
            groups.setdefault(min(count, self.chunk), []).append(index)
        return list(groups.values())

