"""Qwen2-VL and Qwen2.5-VL vision towers (saved on their own, as ``*VisionTransformerPretrainedModel``).

Output: the tower's merged output (``pooler_output`` in transformers 5: the patch merger's rows,
the ones the language model consumes). Each image gives ``t*h*w / merge_size**2`` rows, where
``[t, h, w]`` is its row of ``image_grid_thw``; the batch is split by those counts, never by item
count. ``last_hidden_state`` (pre-merge patch rows) is not served.

Images only for now. VIDEO hook: ``Qwen2VLVideoProcessor`` yields ``pixel_values_videos`` and
``video_grid_thw`` (t = sampled frames / temporal_patch_size); the same tower forward takes them
as ``(pixel_values, grid_thw)`` and the row rule is unchanged. Adding it means: VIDEO in
``modalities``, a ``_video_grid`` beside :meth:`_QwenVisionAdapter._image_grid` for ``measure``,
and a video processor call in ``preprocess`` (videos run one request at a time, see
``Modality.batchable``).
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, ClassVar, Sequence

import torch
from transformers import Qwen2VLImageProcessorPil
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

from encoder_pod.models.base import MediaItem, PreparedBatch
from encoder_pod.models.vision import (
    VisionAdapter,
    check_preset,
    flatten,
    image_size,
    names_family,
    randomize,
    regroup,
    save_atomically,
)

# Tiny: fast tests, yet several 28-px merge units and (for 2.5) several attention windows.
_TINY_PROCESSOR = {"min_pixels": 56 * 56, "max_pixels": 224 * 224}
# Moderate: the processor's own defaults (56*56 .. 28*28*1280 pixels), as the real models use.
_MODERATE_PROCESSOR: dict[str, Any] = {}


class _QwenVisionAdapter(VisionAdapter):
    """Shared by both Qwen generations: same processor, same grid and row rule."""

    model_cls: ClassVar[type]
    config_cls: ClassVar[type]
    model_type: ClassVar[str]
    presets: ClassVar[dict[str, dict[str, Any]]]
    hidden_attr: ClassVar[str]
    """Config field holding the width of the merged output rows."""

    @classmethod
    def matches(cls, config: dict[str, Any]) -> bool:
        """The saved tower's config: its model_type and, if named, its class."""
        return names_family(config, cls.model_type, [cls.model_cls.__name__])

    @classmethod
    def write_tiny(cls, out: Path, preset: str = "tiny") -> None:
        """Seeded random tower plus a ``Qwen2VLImageProcessorPil`` config, written offline."""
        check_preset(preset)
        model = cls.model_cls(cls.config_cls(**cls.presets[preset]))
        randomize(model, seed=zlib.crc32(cls.name.encode()))
        processor = Qwen2VLImageProcessorPil(**(_TINY_PROCESSOR if preset == "tiny" else _MODERATE_PROCESSOR))

        def write(tmp: Path) -> None:
            model.save_pretrained(tmp)
            processor.save_pretrained(tmp)

        save_atomically(out, write)

    def load(self) -> None:
        """Tower via its explicit class (strict weights), processor via its PIL class by name."""
        # By name: AutoImageProcessor would look for the torchvision variant first and warn.
        self.processor = Qwen2VLImageProcessorPil.from_pretrained(self.model_dir)
        self.model = self._load_checked(self.model_cls)
        self._check_processor()

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

    def _image_grid(self, height: int, width: int) -> list[int]:
        """``[t, h, w]`` the processor will report, from the processor's own smart_resize.

        The PIL processor gives every image t = 1 (the still frame fills the temporal patch).
        """
        proc = self.processor
        resized_h, resized_w = smart_resize(
            height,
            width,
            factor=proc.patch_size * proc.merge_size,
            min_pixels=proc.size.shortest_edge,
            max_pixels=proc.size.longest_edge,
        )
        return [1, resized_h // proc.patch_size, resized_w // proc.patch_size]

    def measure(self, item: MediaItem) -> int:
        """Merged rows for one image, computed from its size without running the processor."""
        width, height = image_size(item, self.modalities)
        t, h, w = self._image_grid(height, width)
        return t * h * w // self.merge_size**2

    def preprocess(self, requests: Sequence[Sequence[MediaItem]]) -> PreparedBatch:
        """One processor call: patch rows of all images concatenated, one grid row per image."""
        out = self._process(flatten(requests))
        grids = out["image_grid_thw"].tolist()
        tokens = [t * h * w // self.merge_size**2 for t, h, w in grids]
        return PreparedBatch(
            inputs={"pixel_values": out["pixel_values"], "grid_thw": out["image_grid_thw"]},
            item_tokens=regroup(tokens, requests),
            item_grids=regroup(grids, requests),
        )

    def forward(self, batch: PreparedBatch) -> torch.Tensor:
        """One tower forward; attention never crosses images (cu_seqlens from grid_thw)."""
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
    model_type = "qwen2_vl_vision"
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
    model_type = "qwen2_5_vl_vision"
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
