"""LLaVA-NeXT (1.6) anyres: one image becomes several tiles, each a full pass of the vision tower.

The processor picks the best grid pinpoint for an image, cuts it into ``side x side`` tiles and adds
a downscaled base tile; ``pixel_values`` is (images, most tiles in the batch, 3, side, side),
padded with all-zero tiles to the largest tile count. Padding tiles are dropped before the tower
(they would cost a forward each and, worse, their rows would shift every later image's slice).

Served rows per image: ``tiles * rows_per_tile`` of the multi-modal projector's output, i.e. what
``LlavaNextModel.get_image_features`` computes before ``pack_image_features``: the feature layer
(``vision_feature_layer``, default -2) without CLS (strategy ``default``), projected to the language
model's width. Unpadding and the newline rows depend only on the image size, so the language-model
side packs them; the item grid is ``[tiles, height, width]`` of the original image for that.

Loading: a LLaVA-NeXT checkpoint is the whole model. Only the vision tower and the projector are
kept; the language model is built with zero decoder layers, its layer weights are never read, and
its embeddings (read, then freed) are the only cost beyond the tower.
"""

from __future__ import annotations

import logging
import re
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from PIL import Image
from transformers import CLIPVisionConfig, LlamaConfig, LlavaNextConfig, LlavaNextImageProcessorPil
from transformers.models.llava_next.modeling_llava_next import (
    LlavaNextForConditionalGeneration,
    image_size_to_num_patches,
)

from encoder_pod.models.base import MediaItem, PreparedBatch, check_loading_info
from encoder_pod.models.family import FamilyCode, Layout
from encoder_pod.models.vision import (
    VisionAdapter,
    check_preset,
    flatten,
    image_size,
    randomize,
    regroup,
    save_atomically,
)

_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # 32 px tiles of 8 px patches: 16 rows per tile, 3-5 tiles per image.
    "tiny": {
        "vision": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
                   "image_size": 32, "patch_size": 8},
        "text": {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                 "num_attention_heads": 2, "num_key_value_heads": 2},
    },
    # The moderate CLIP of shared/reference/models.md (/16, 224 px, 384 wide, 4 layers): 196 rows per tile.
    "moderate": {
        "vision": {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 6,
                   "image_size": 224, "patch_size": 16},
        "text": {"vocab_size": 256, "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 1,
                 "num_attention_heads": 8, "num_key_value_heads": 8},
    },
}


def _pinpoints(side: int) -> list[list[int]]:
    """LLaVA-1.6's grid (1x2, 2x1, 2x2, 1x3, 3x1 tiles) for a tower of ``side`` px."""
    return [[side, 2 * side], [2 * side, side], [2 * side, 2 * side], [3 * side, side], [side, 3 * side]]


_LM_LAYER = re.compile(r"(^|\.)language_model\.(model\.)?layers\.")
"""Checkpoint keys of the language model's decoder layers: present, deliberately not loaded."""


class _NoLoadReport(logging.Filter):
    """Drops transformers' load report, which would list every skipped language-model weight as
    UNEXPECTED; :func:`check_loading_info` reports (and raises on) anything else instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)


@contextmanager
def _quiet_load_report() -> Iterator[None]:
    logger, quiet = logging.getLogger("transformers.modeling_utils"), _NoLoadReport()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


class LlavaNextAdapter(VisionAdapter):
    """LLaVA-NeXT checkpoint (``LlavaNextForConditionalGeneration``); serves projected tile rows."""

    name = "llava_next"

    tower: Any
    projector: Any

    def load(self) -> None:
        """Tower and projector (strict), the language model's layers never built, PIL processor by name."""
        config = LlavaNextConfig.from_pretrained(self.model_dir)
        config.text_config.num_hidden_layers = 0
        if getattr(config.text_config, "layer_types", None) is not None:
            config.text_config.layer_types = []
        with _quiet_load_report():
            model, info = LlavaNextForConditionalGeneration.from_pretrained(
                self.model_dir, config=config, dtype=self.dtype, output_loading_info=True
            )
        info["unexpected_keys"] = {k for k in info["unexpected_keys"] if not _LM_LAYER.search(k)}
        check_loading_info("LlavaNextForConditionalGeneration", info)
        self.config = config
        self.tower = model.model.vision_tower.to(self.device).eval()
        self.projector = model.model.multi_modal_projector.to(self.device).eval()
        del model  # the language model's embeddings and head go with it
        self.feature_layers = self._trim_tower()
        self.processor = LlavaNextImageProcessorPil.from_pretrained(self.model_dir)
        self.rows_per_tile = self._check_processor()

    def _trim_tower(self) -> list[int]:
        """Drop tower layers after the deepest feature layer; returns the layers as ``hidden_states`` indices."""
        layers = self.tower.encoder.layers
        wanted = self.config.vision_feature_layer
        wanted = [wanted] if isinstance(wanted, int) else list(wanted)
        # hidden_states has len(layers) + 1 entries (the embeddings first).
        positive = [k if k >= 0 else len(layers) + 1 + k for k in wanted]
        if any(not 0 <= k <= len(layers) for k in positive):
            raise RuntimeError(f"vision_feature_layer {wanted} is outside a tower of {len(layers)} layers")
        self.tower.encoder.layers = layers[: max(positive)]
        return positive

    @property
    def side(self) -> int:
        """Tile side in pixels (the tower's image size)."""
        return int(self.config.vision_config.image_size)

    def _check_processor(self) -> int:
        """Rows per tile; refuses a processor that tiles differently from the model's config."""
        proc, config = self.processor, self.config
        if [list(p) for p in proc.image_grid_pinpoints] != [list(p) for p in config.image_grid_pinpoints]:
            raise RuntimeError(
                f"preprocessor_config.json in {self.model_dir} has image_grid_pinpoints {proc.image_grid_pinpoints}, "
                f"the model's config {config.image_grid_pinpoints}"
            )
        shape = tuple(self._process([Image.new("RGB", (37, 53))])["pixel_values"].shape[-2:])
        if shape != (self.side, self.side):
            raise RuntimeError(
                f"preprocessor_config.json in {self.model_dir} gives {shape[0]}x{shape[1]} tiles, "
                f"the tower takes {self.side}x{self.side}"
            )
        patches = (self.side // int(config.vision_config.patch_size)) ** 2
        if config.vision_feature_select_strategy == "default":
            return patches  # CLS dropped
        if config.vision_feature_select_strategy == "full":
            return patches + 1
        raise RuntimeError(f"unknown vision_feature_select_strategy {config.vision_feature_select_strategy!r}")

    def tiles(self, height: int, width: int) -> int:
        """Tiles the processor makes of an image (base tile included), as the model counts them."""
        return image_size_to_num_patches((height, width), self.config.image_grid_pinpoints, self.side)

    def measure(self, item: MediaItem) -> int:
        """Tiles times rows per tile, from the image size alone."""
        width, height = image_size(item, self.modalities)
        return self.tiles(height, width) * self.rows_per_tile

    def preprocess(self, requests: Sequence[Sequence[MediaItem]]) -> PreparedBatch:
        """One processor call, then the padding tiles are cut: (real tiles, 3, side, side)."""
        out = self._process(flatten(requests))
        pixel_values, sizes = out["pixel_values"], out["image_sizes"].tolist()
        tiles = [self.tiles(h, w) for h, w in sizes]
        if pixel_values.ndim != 5 or max(tiles) > pixel_values.shape[1]:
            raise ValueError(f"processor gave pixel_values {tuple(pixel_values.shape)} for tile counts {tiles}")
        real = torch.cat([pixel_values[i, :n] for i, n in enumerate(tiles)])
        return PreparedBatch(
            inputs={"pixel_values": real},
            item_tokens=regroup([n * self.rows_per_tile for n in tiles], requests),
            item_grids=regroup([[n, h, w] for n, (h, w) in zip(tiles, sizes)], requests),
        )

    def forward(self, batch: PreparedBatch) -> torch.Tensor:
        """Tower over real tiles only, feature layer(s) selected, projected; rows in tile order."""
        with torch.inference_mode():
            pixels = batch.inputs["pixel_values"].to(self.device, self.dtype)
            hidden = self.tower(pixels, output_hidden_states=True).hidden_states
            features = torch.cat([hidden[k] for k in self.feature_layers], dim=-1)
            if self.config.vision_feature_select_strategy == "default":
                features = features[:, 1:]
            projected = self.projector(features)
            return projected.reshape(-1, projected.shape[-1])

    @property
    def hidden_size(self) -> int:
        """Width of a projected row (the language model's hidden size)."""
        return int(self.config.text_config.hidden_size)


def write_tiny(out: Path, preset: str = "tiny") -> None:
    """A whole random LLaVA-NeXT (CLIP tower, projector, one-layer Llama) and its PIL processor config."""
    check_preset(preset)
    sizes = _PRESETS[preset]
    side = sizes["vision"]["image_size"]
    vocab = sizes["text"]["vocab_size"]
    config = LlavaNextConfig(
        vision_config=CLIPVisionConfig(**sizes["vision"]).to_dict(),
        text_config=LlamaConfig(**sizes["text"], pad_token_id=0, bos_token_id=1, eos_token_id=2).to_dict(),
        image_grid_pinpoints=_pinpoints(side),
        image_token_id=vocab - 1,
    )
    model = LlavaNextForConditionalGeneration(config)
    randomize(model, seed=zlib.crc32(LlavaNextAdapter.name.encode()))
    processor = LlavaNextImageProcessorPil(
        size={"shortest_edge": side},
        crop_size={"height": side, "width": side},
        image_grid_pinpoints=_pinpoints(side),
    )

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)

    save_atomically(out, write)


LLAVA_NEXT_CODE = FamilyCode(adapters={Layout.FULL: LlavaNextAdapter}, write_tiny=lambda out, preset, layout: write_tiny(out, preset))
