"""Qwen2-VL and Qwen2.5-VL vision towers (saved on their own, as ``*VisionTransformerPretrainedModel``).

Output: the tower's merged output (``pooler_output`` in transformers 5: the patch merger's rows,
the ones the language model consumes). Each image or video gives ``t*h*w / merge_size**2`` rows,
where ``[t, h, w]`` is its row of ``image_grid_thw`` / ``video_grid_thw``; the batch is split by
those counts, never by item count. ``last_hidden_state`` (pre-merge patch rows) is not served.

VIDEO: ``Qwen2VLVideoProcessor`` imports torchvision at module level, and torchvision does not
import beside the CPU torch build this project pins (shared/reference/models.md). So frames go
through the same PIL image processor (one call for all frames, resized to the video pixel bounds),
and :func:`video_patches` lays the per-frame patches out exactly as the video processor's
``patchify`` does: frames padded to a multiple of ``temporal_patch_size`` with the last frame,
each ``temporal_patch_size`` consecutive frames stacked into one temporal patch. The one
difference from the video processor is the resampling filter (PIL bicubic, as for images, vs
torchvision's antialiased bicubic on tensors). Frames are sampled by the decoder (ENCODER_VIDEO_FPS
between ENCODER_VIDEO_MIN_FRAMES and ENCODER_VIDEO_MAX_FRAMES); videos run one request at a time
(``Modality.batchable``).
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np
import torch
from transformers import Qwen2VLImageProcessorPil
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

from encoder_pod.errors import MediaError
from encoder_pod.modality import Modality
from encoder_pod.models.base import MediaItem, PreparedBatch, VideoClip
from encoder_pod.models.family import FamilyCode, Layout
from encoder_pod.models.vision import (
    MAX_ASPECT_RATIO,
    VisionAdapter,
    check_preset,
    flatten,
    health_image,
    image_size,
    randomize,
    regroup,
    save_atomically,
)

# Tiny: fast tests, yet several 28-px merge units and (for 2.5) several attention windows.
_TINY_PROCESSOR = {"min_pixels": 56 * 56, "max_pixels": 224 * 224}
# Moderate: the processor's own defaults (56*56 .. 28*28*1280 pixels), as the real models use.
_MODERATE_PROCESSOR: dict[str, Any] = {}

VIDEO_CONFIG = "video_preprocessor_config.json"
"""The checkpoint's video processor config; only its pixel bounds (and mean/std) are read."""
# Per-frame pixel bounds. Tiny: 56x56 .. 112x112, a few rows per frame pair. Moderate and a
# checkpoint without a video config: Qwen2VLVideoProcessor's class defaults.
_VIDEO_PIXELS = {"tiny": (56 * 56, 112 * 112), "moderate": (128 * 28 * 28, 768 * 28 * 28)}


def video_patches(frame_patches: torch.Tensor, frames: int, temporal: int, patch: int) -> tuple[torch.Tensor, int]:
    """Per-frame patches of the image processor -> the video processor's temporal patches.

    ``frame_patches`` is (frames * n, C * temporal * patch**2), every row holding its frame
    ``temporal`` times (the image processor's still-frame patchify). Returns
    (ceil(frames / temporal) * n, same width) with consecutive frames stacked in the temporal
    axis, the last frame repeated to fill the final patch, and the grid's t.
    """
    rows, width = frame_patches.shape
    per_frame = rows // frames
    channels = width // (temporal * patch * patch)
    stills = frame_patches.reshape(frames, per_frame, channels, temporal, patch * patch)[:, :, :, 0]
    if pad := -frames % temporal:
        stills = torch.cat([stills, stills[-1:].expand(pad, -1, -1, -1)])
    t = stills.shape[0] // temporal
    grouped = stills.reshape(t, temporal, per_frame, channels, patch * patch).permute(0, 2, 3, 1, 4)
    return grouped.reshape(t * per_frame, width), t


class _QwenVisionAdapter(VisionAdapter):
    """Shared by both Qwen generations: same processor, same grid and row rule."""

    modalities: ClassVar[frozenset[Modality]] = frozenset({Modality.IMAGE, Modality.VIDEO})
    model_cls: ClassVar[type]
    config_cls: ClassVar[type]
    presets: ClassVar[dict[str, dict[str, Any]]]
    """Tower sizes of the tiny checkpoints (:func:`write_tiny`)."""
    video_kwargs: dict[str, Any]
    """Processor-call overrides for video frames: ``size`` (pixel bounds), mean and std."""
    hidden_attr: ClassVar[str]
    """Config field holding the width of the merged output rows."""

    def load(self) -> None:
        """Tower via its explicit class (strict weights), processor via its PIL class by name."""
        # By name: AutoImageProcessor would look for the torchvision variant first and warn.
        self.processor = Qwen2VLImageProcessorPil.from_pretrained(self.model_dir)
        self.model = self._load_checked(self.model_cls)
        self._check_processor()
        self.video_kwargs = self._video_kwargs()

    def _video_kwargs(self) -> dict[str, Any]:
        """Pixel bounds (and mean/std) for frames, from the checkpoint's video processor config."""
        path = self.model_dir / VIDEO_CONFIG
        config = json.loads(path.read_text()) if path.is_file() else {}
        for key in ("patch_size", "temporal_patch_size", "merge_size"):
            if key in config and config[key] != getattr(self.processor, key):
                raise RuntimeError(
                    f"{path}: {key} {config[key]} differs from preprocessor_config.json's {getattr(self.processor, key)}"
                )
        size = config.get("size") or {}
        low = config.get("min_pixels", size.get("shortest_edge", _VIDEO_PIXELS["moderate"][0]))
        high = config.get("max_pixels", size.get("longest_edge", _VIDEO_PIXELS["moderate"][1]))
        if not 0 < low <= high:
            raise RuntimeError(f"{path}: video pixel bounds {low}..{high} are not a range")
        kwargs: dict[str, Any] = {"size": {"shortest_edge": int(low), "longest_edge": int(high)}}
        kwargs.update({key: config[key] for key in ("image_mean", "image_std") if key in config})
        return kwargs

    def _check_processor(self) -> None:
        """The processor must cut patches the way this tower embeds them, and resize (measure relies on it)."""
        config, proc = self.model.config, self.processor
        pairs = {
            "patch_size": (proc.patch_size, config.patch_size),
            "merge_size/spatial_merge_size": (proc.merge_size, config.spatial_merge_size),
            "temporal_patch_size": (proc.temporal_patch_size, config.temporal_patch_size),
        }
        bad = {k: v for k, v in pairs.items() if v[0] != v[1]}
        if bad:
            detail = ", ".join(f"{k}: processor {p} vs tower {t}" for k, (p, t) in bad.items())
            raise RuntimeError(f"preprocessor_config.json does not fit the tower in {self.model_dir}: {detail}")
        if not proc.do_resize:
            raise RuntimeError(
                f"preprocessor_config.json in {self.model_dir} has do_resize false; "
                "measure() assumes the processor's smart_resize"
            )

    @property
    def merge_size(self) -> int:
        """Patches merged per side into one output row."""
        return int(self.processor.merge_size)

    def _image_grid(self, height: int, width: int, bounds: tuple[int, int] | None = None) -> list[int]:
        """``[t, h, w]`` the processor will report, from the processor's own smart_resize.

        The PIL processor gives every image t = 1 (the still frame fills the temporal patch).
        ``bounds`` overrides the (min, max) pixels, as the video frames' call does.
        """
        proc = self.processor
        low, high = bounds or (proc.size.shortest_edge, proc.size.longest_edge)
        resized_h, resized_w = smart_resize(
            height, width, factor=proc.patch_size * proc.merge_size, min_pixels=low, max_pixels=high
        )
        return [1, resized_h // proc.patch_size, resized_w // proc.patch_size]

    def _video_grid(self, item: MediaItem) -> list[int]:
        """``[t, h, w]`` of a clip: frames padded to whole temporal patches, resized as one frame."""
        clip = item.data
        frames = getattr(clip, "frames", None)
        if not isinstance(clip, VideoClip) or not isinstance(frames, np.ndarray):
            raise MediaError(f"a VIDEO item must be a decoded clip, got {type(clip).__name__}")
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or min(frames.shape[:3]) < 1:
            raise MediaError(f"a clip must be (frames, height, width, 3) uint8, got {frames.shape} {frames.dtype}")
        count, height, width = frames.shape[:3]
        if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
            raise MediaError(f"video frames {width}x{height} exceed the aspect ratio of {MAX_ASPECT_RATIO}:1")
        size = self.video_kwargs["size"]
        _, h, w = self._image_grid(height, width, (size["shortest_edge"], size["longest_edge"]))
        temporal = self.processor.temporal_patch_size
        return [-(-count // temporal), h, w]

    def measure(self, item: MediaItem) -> int:
        """Merged rows for one image or clip, computed from its size without running the processor."""
        if item.modality is Modality.VIDEO:
            t, h, w = self._video_grid(item)
        else:
            width, height = image_size(item, self.modalities)
            t, h, w = self._image_grid(height, width)
        return t * h * w // self.merge_size**2

    def preprocess(self, requests: Sequence[Sequence[MediaItem]]) -> PreparedBatch:
        """One processor call: patch rows of all images (or clips) concatenated, one grid row each."""
        if any(item.modality is Modality.VIDEO for items in requests for item in items):
            return self._preprocess_videos(requests)
        out = self._process(flatten(requests))
        grids = out["image_grid_thw"].tolist()
        tokens = [t * h * w // self.merge_size**2 for t, h, w in grids]
        return PreparedBatch(
            inputs={"pixel_values": out["pixel_values"], "grid_thw": out["image_grid_thw"]},
            item_tokens=regroup(tokens, requests),
            item_grids=regroup(grids, requests),
        )

    def _preprocess_videos(self, requests: Sequence[Sequence[MediaItem]]) -> PreparedBatch:
        """One processor call over every frame of every clip, regrouped into temporal patches."""
        clips = [item.data for items in requests for item in items]
        if any(not isinstance(clip, VideoClip) for clip in clips):
            raise ValueError("a VIDEO batch holds only decoded clips")
        proc = self.processor
        frames = [frame for clip in clips for frame in clip.frames]
        out = proc(images=frames, return_tensors="pt", input_data_format="channels_last", **self.video_kwargs)
        frame_rows = (out["image_grid_thw"][:, 1] * out["image_grid_thw"][:, 2]).tolist()
        patches, grids, start, first = [], [], 0, 0
        for clip in clips:
            count = len(clip.frames)
            rows = sum(frame_rows[first : first + count])
            clip_patches, t = video_patches(
                out["pixel_values"][start : start + rows], count, proc.temporal_patch_size, proc.patch_size
            )
            _, h, w = out["image_grid_thw"][first].tolist()
            patches.append(clip_patches)
            grids.append([t, h, w])
            start, first = start + rows, first + count
        tokens = [t * h * w // self.merge_size**2 for t, h, w in grids]
        return PreparedBatch(
            inputs={"pixel_values": torch.cat(patches), "grid_thw": torch.tensor(grids, dtype=torch.long)},
            item_tokens=regroup(tokens, requests),
            item_grids=regroup(grids, requests),
        )

    def health_item(self, modality: Modality) -> MediaItem:
        """A 32x32 image, or a two-frame 32x32 clip (one temporal patch) for VIDEO."""
        if modality is not Modality.VIDEO:
            return super().health_item(modality)
        still = np.asarray(health_image().data)
        return MediaItem(Modality.VIDEO, VideoClip(frames=np.stack([still, still[::-1]]), fps=2.0))

    def forward(self, batch: PreparedBatch) -> torch.Tensor:
        """One tower forward; attention never crosses images or clips (cu_seqlens from grid_thw)."""
        with torch.inference_mode():
            pixels = batch.inputs["pixel_values"].to(self.device, self.dtype)
            grid = batch.inputs["grid_thw"].to(self.device)
            return self.model(pixels, grid_thw=grid).pooler_output

    @property
    def hidden_size(self) -> int:
        """Width of a merged row (what the language model receives)."""
        return int(getattr(self.model.config, self.hidden_attr))


class Qwen2VLAdapter(_QwenVisionAdapter):
    """Qwen2-VL vision tower (``qwen2_vl_vision``)."""

    name = "qwen2_vl"
    model_cls = Qwen2VisionTransformerPretrainedModel
    config_cls = Qwen2VLVisionConfig
    hidden_attr = "hidden_size"
    presets = {
        "tiny": {"depth": 2, "embed_dim": 64, "hidden_size": 128, "num_heads": 4, "mlp_ratio": 2},
        # 10.7M parameters, the size measured in shared/reference/models.md.
        "moderate": {"depth": 4, "embed_dim": 384, "hidden_size": 512, "num_heads": 6, "mlp_ratio": 4},
    }


class Qwen25VLAdapter(_QwenVisionAdapter):
    """Qwen2.5-VL vision tower (``qwen2_5_vl_vision``): windowed attention, RMSNorm, SwiGLU."""

    name = "qwen2_5_vl"
    model_cls = Qwen2_5_VisionTransformerPretrainedModel
    config_cls = Qwen2_5_VLVisionConfig
    # In 2.5, hidden_size is the tower's inner width; the merger projects to out_hidden_size.
    hidden_attr = "out_hidden_size"
    presets = {
        # window_size 112 px = 4x4 merge units: a 224 px image spans several windows.
        "tiny": {
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 4,
            "out_hidden_size": 128,
            "window_size": 112,
            "fullatt_block_indexes": [1],
        },
        "moderate": {
            "depth": 4,
            "hidden_size": 384,
            "intermediate_size": 1024,
            "num_heads": 6,
            "out_hidden_size": 512,
            "window_size": 112,
            "fullatt_block_indexes": [1, 3],
        },
    }


def write_tiny(adapter: type[_QwenVisionAdapter], out: Path, preset: str = "tiny") -> None:
    """Seeded random ``adapter`` tower plus a ``Qwen2VLImageProcessorPil`` config, written offline."""
    check_preset(preset)
    model = adapter.model_cls(adapter.config_cls(**adapter.presets[preset]))
    randomize(model, seed=zlib.crc32(adapter.name.encode()))
    processor = Qwen2VLImageProcessorPil(**(_TINY_PROCESSOR if preset == "tiny" else _MODERATE_PROCESSOR))
    low, high = _VIDEO_PIXELS[preset]
    video = {
        "video_processor_type": "Qwen2VLVideoProcessor",
        "size": {"shortest_edge": low, "longest_edge": high},
        **{key: getattr(processor, key) for key in ("patch_size", "temporal_patch_size", "merge_size")},
        **{key: list(getattr(processor, key)) for key in ("image_mean", "image_std")},
    }

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        (tmp / VIDEO_CONFIG).write_text(json.dumps(video, indent=2) + "\n")

    save_atomically(out, write)


QWEN2_VL_CODE = FamilyCode(
    adapters={Layout.TOWER: Qwen2VLAdapter},
    write_tiny=lambda out, preset, layout: write_tiny(Qwen2VLAdapter, out, preset),
)
QWEN2_5_VL_CODE = FamilyCode(
    adapters={Layout.TOWER: Qwen25VLAdapter},
    write_tiny=lambda out, preset, layout: write_tiny(Qwen25VLAdapter, out, preset),
)
