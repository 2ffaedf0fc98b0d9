"""What every Qwen vision tower shares: grids, patches, video, the merged rows, video timing facts.

Output: the tower's merged rows (the patch merger's output, ``pooler_output``: what the language
model splices in at its image/video placeholders). Each image or clip gives ``t*h*w / merge**2``
rows, where ``[t, h, w]`` is its grid; the batch is split by those counts, never by item count.
Qwen3-VL's towers also compute *deepstack* features (the merged hidden state after some blocks,
added to the first language-model layers): they are served as SGLang's encoder serves them, one
row per token ``[merger | deepstack_0 | deepstack_1 ...]`` concatenated along the hidden axis.

VIDEO without torchvision: the Qwen video processors import it at module level, and the pod
does not depend on it. Frames go through the same PIL image processor (one call for all frames),
resized to the size the family's video processor would choose, and :func:`video_patches` lays the
per-frame patches out as the video processor's ``patchify`` does (frames padded to whole temporal
patches with the last frame). The size rules differ by generation:

- Qwen2-VL / Qwen2.5-VL (``Qwen2VLVideoProcessor``): the pixel bounds apply to one frame.
- Qwen3-VL / Qwen3.5 (``Qwen3VLVideoProcessor``): the bounds apply to the whole clip
  (``t_bar * h * w``), with factor ``patch * merge``: that processor's own ``smart_resize``.

The one remaining difference from the video processors is the resampling filter (PIL bicubic vs
torchvision's antialiased bicubic on tensors). Per video item the prefill side also needs timing:
``second_per_grid_ts`` (temporal patch / sampled fps; Qwen2.5-VL and the Omni models) or
``video_timestamps`` (seconds per temporal grid, from the source frame positions; Qwen3-VL, Qwen3.5).
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np
import torch
from PIL import Image
from transformers import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as clip_smart_resize

from encoder_pod.errors import MediaError
from encoder_pod.modality import Modality
from encoder_pod.models.base import MediaItem, PreparedBatch, VideoClip
from encoder_pod.models.vision import MAX_ASPECT_RATIO, VisionAdapter, flatten, health_image, image_size, regroup

VIDEO_CONFIG = "video_preprocessor_config.json"
"""The checkpoint's video processor config; its pixel bounds (and mean/std) are read."""


class VideoTiming(str, Enum):
    """Which per-video timing fact the family's language model reads."""

    NONE = "none"
    SECOND_PER_GRID = "second_per_grid_ts"
    TIMESTAMPS = "video_timestamps"


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


def grid_timestamps(clip: VideoClip, temporal: int) -> list[float]:
    """Seconds per temporal grid, as ``Qwen3VLProcessor._calculate_timestamps`` computes them.

    Frame positions padded to whole temporal patches with the last one, then the mean of the first
    and last frame time of each patch; from the source positions and fps when the decoder knew them.
    """
    times = clip.timestamps()
    if pad := -len(times) % temporal:
        times = times + [times[-1]] * pad
    return [(times[i] + times[i + temporal - 1]) / 2 for i in range(0, len(times), temporal)]


def video_processor_config(model_dir: Path) -> tuple[dict[str, Any], str]:
    """(the video processor's saved config, the file it came from); ({}, "") when the checkpoint has none."""
    path = Path(model_dir) / VIDEO_CONFIG
    if path.is_file():
        return json.loads(path.read_text()), VIDEO_CONFIG
    nested = Path(model_dir) / "processor_config.json"
    if nested.is_file():
        content = json.loads(nested.read_text()).get("video_processor")
        if isinstance(content, dict):
            return content, "processor_config.json"
    return {}, ""


def _clip_frames(item: MediaItem) -> np.ndarray:
    """The frames of a VIDEO item, checked; :class:`MediaError` naming what is wrong."""
    clip = item.data
    frames = getattr(clip, "frames", None)
    if not isinstance(clip, VideoClip) or not isinstance(frames, np.ndarray):
        raise MediaError(f"a VIDEO item must be a decoded clip, got {type(clip).__name__}")
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or min(frames.shape[:3]) < 1:
        raise MediaError(f"a clip must be (frames, height, width, 3) uint8, got {frames.shape} {frames.dtype}")
    height, width = frames.shape[1:3]
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaError(f"video frames {width}x{height} exceed the aspect ratio of {MAX_ASPECT_RATIO}:1")
    return frames


class QwenVisionAdapter(VisionAdapter):
    """Images and clips through a Qwen vision tower; subclasses say how the tower is loaded."""

    modalities: ClassVar[frozenset[Modality]] = frozenset({Modality.IMAGE, Modality.VIDEO})
    clip_bounds: ClassVar[bool] = False
    """True: the video pixel bounds apply to the whole clip (Qwen3-VL); False: to each frame."""
    timing: ClassVar[VideoTiming] = VideoTiming.NONE
    default_video_pixels: ClassVar[tuple[int, int]] = (128 * 28 * 28, 768 * 28 * 28)
    """The video processor's class default bounds, for a checkpoint that saved none."""
    hidden_attr: ClassVar[str] = "hidden_size"
    """Tower config field holding the width of the merged output rows."""

    model: Any
    video_kwargs: dict[str, Any]
    """Processor-call overrides for video frames: ``size`` (pixel bounds), mean and std."""

    def load(self) -> None:
        """Tower (subclass), PIL image processor by name, video settings from the checkpoint."""
        # By name: AutoImageProcessor would look for the torchvision variant first and warn.
        self.processor = Qwen2VLImageProcessorPil.from_pretrained(self.model_dir)
        self.model = self._load_tower()
        self._check_processor()
        self.video_kwargs, self.video_pixel_cap = self._video_kwargs()

    def _load_tower(self) -> Any:
        """The loaded tower module (weights strict), in eval mode on the adapter's device."""
        raise NotImplementedError

    def _video_kwargs(self) -> tuple[dict[str, Any], int | None]:
        """(pixel bounds, mean and std for frames, per-frame pixel cap) from the checkpoint's video config."""
        config, source = video_processor_config(self.model_dir)
        where = self.model_dir / (source or VIDEO_CONFIG)
        for key in ("patch_size", "temporal_patch_size", "merge_size"):
            if key in config and config[key] != getattr(self.processor, key):
                raise RuntimeError(
                    f"{where}: {key} {config[key]} differs from the image processor's {getattr(self.processor, key)}"
                )
        size = config.get("size") or {}
        low = config.get("min_pixels", size.get("shortest_edge", self.default_video_pixels[0]))
        high = config.get("max_pixels", size.get("longest_edge", self.default_video_pixels[1]))
        if not 0 < low <= high:
            raise RuntimeError(f"{where}: video pixel bounds {low}..{high} are not a range")
        kwargs: dict[str, Any] = {"size": {"shortest_edge": int(low), "longest_edge": int(high)}}
        kwargs.update({key: config[key] for key in ("image_mean", "image_std") if key in config})
        cap = None
        if self.clip_bounds and config.get("cap_pixels_per_frame"):
            factor = self.processor.patch_size * self.processor.merge_size
            cap = int(config.get("max_video_tokens", 768)) * factor * factor
        return kwargs, cap

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
            raise RuntimeError(f"the image processor config does not fit the tower in {self.model_dir}: {detail}")
        if not proc.do_resize:
            raise RuntimeError(
                f"the image processor config in {self.model_dir} has do_resize false; measure() assumes smart_resize"
            )

    @property
    def merge_size(self) -> int:
        """Patches merged per side into one output row."""
        return int(self.processor.merge_size)

    def _image_grid(self, height: int, width: int, bounds: tuple[int, int] | None = None) -> list[int]:
        """``[1, h, w]`` the processor will report, from its own smart_resize (``bounds``: min/max pixels)."""
        proc = self.processor
        low, high = bounds or (proc.size.shortest_edge, proc.size.longest_edge)
        resized_h, resized_w = smart_resize(
            height, width, factor=proc.patch_size * proc.merge_size, min_pixels=low, max_pixels=high
        )
        return [1, resized_h // proc.patch_size, resized_w // proc.patch_size]

    def _frame_size(self, count: int, height: int, width: int) -> tuple[int, int]:
        """(height, width) every frame of a ``count``-frame clip is resized to."""
        proc, size = self.processor, self.video_kwargs["size"]
        if not self.clip_bounds:
            _, h, w = self._image_grid(height, width, (size["shortest_edge"], size["longest_edge"]))
            return h * proc.patch_size, w * proc.patch_size
        if count < proc.temporal_patch_size:
            raise MediaError(f"a clip needs at least {proc.temporal_patch_size} frames for this model, got {count}")
        high = size["longest_edge"]
        if self.video_pixel_cap is not None:
            per_frame = max(min(self.video_pixel_cap, high // count), int(size["shortest_edge"] * 1.05))
            high = per_frame * count
        factor = proc.patch_size * proc.merge_size
        # Qwen3VLVideoProcessor's own rule (its module imports without torchvision; the resize does not).
        return clip_smart_resize(count, height, width, proc.temporal_patch_size, factor, size["shortest_edge"], high)

    def _video_grid(self, item: MediaItem) -> list[int]:
        """``[t, h, w]`` of a clip: frames padded to whole temporal patches, each resized by the family's rule."""
        frames = _clip_frames(item)
        count, height, width = frames.shape[:3]
        h, w = self._frame_size(count, height, width)
        patch = self.processor.patch_size
        return [-(-count // self.processor.temporal_patch_size), h // patch, w // patch]

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
        """One processor call over every (resized) frame of every clip, regrouped into temporal patches."""
        clips = [item.data for items in requests for item in items]
        if any(not isinstance(clip, VideoClip) for clip in clips):
            raise ValueError("a VIDEO batch holds only decoded clips")
        proc = self.processor
        if self.clip_bounds:
            # One size for the whole clip (the bounds are on t * h * w): resized here, so the
            # processor's own per-frame resize is switched off.
            frames: list[np.ndarray] = []
            for clip in clips:
                h, w = self._frame_size(*clip.frames.shape[:3])
                frames.extend(np.asarray(Image.fromarray(f).resize((w, h), Image.Resampling.BICUBIC)) for f in clip.frames)
            kwargs = {key: value for key, value in self.video_kwargs.items() if key != "size"}
            kwargs["do_resize"] = False
        else:
            frames = [frame for clip in clips for frame in clip.frames]
            kwargs = dict(self.video_kwargs)
        out = proc(images=frames, return_tensors="pt", input_data_format="channels_last", **kwargs)
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
            request_extras=[self._timing([item.data for item in items]) for items in requests],
        )

    def _timing(self, clips: Sequence[VideoClip]) -> dict[str, Any]:
        """The request's per-video timing fact for the prefill side (none for Qwen2-VL)."""
        temporal = int(self.processor.temporal_patch_size)
        if self.timing is VideoTiming.SECOND_PER_GRID:
            return {"second_per_grid_ts": [temporal / clip.fps for clip in clips]}
        if self.timing is VideoTiming.TIMESTAMPS:
            return {"video_timestamps": [grid_timestamps(clip, temporal) for clip in clips]}
        return {}

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
            out = self.model(pixels, grid_thw=grid)
            deepstack = list(getattr(out, "deepstack_features", None) or [])
            return torch.cat([out.pooler_output, *deepstack], dim=1) if deepstack else out.pooler_output

    @property
    def deepstack_layers(self) -> int:
        """Deepstack features served after the merger rows (0 without deepstack)."""
        return len(getattr(self.model.config, "deepstack_visual_indexes", None) or [])

    def embedding_layout(self) -> list[str]:
        """``merger`` then one ``deepstack_<k>`` block per deepstack layer, each ``merger_width`` wide."""
        return ["merger", *(f"deepstack_{k}" for k in range(self.deepstack_layers))]

    @property
    def merger_width(self) -> int:
        """Width of the merger's rows (the language model's hidden size)."""
        return int(getattr(self.model.config, self.hidden_attr))

    @property
    def hidden_size(self) -> int:
        """Width of one served row: the merger's, times (1 + deepstack layers)."""
        return self.merger_width * (1 + self.deepstack_layers)

    def info(self) -> dict[str, Any]:
        """Base facts plus the deepstack layout and the video rule."""
        return {
            **super().info(),
            "merger_width": self.merger_width,
            "video_timing": self.timing.value,
            "video_bounds": "per clip" if self.clip_bounds else "per frame",
        }
