"""InternVL in transformers' own format (``OpenGVLab/InternVL3-1B-hf`` ...), out of the whole checkpoint.

Served rows: ``InternVLModel.get_image_features`` run on the tower and projector only: the chosen
feature layer without CLS, pixel-shuffled by ``downsample_ratio`` (4 patches -> 1 row of 4x
width), then ``multi_modal_projector``. Each image is cut into tiles by ``GotOcr2ImageProcessor``
(``crop_to_patches``: a grid of tiles plus a thumbnail when there is more than one); every tile
gives ``image_seq_length`` rows, so an image gives ``tiles x image_seq_length`` rows: the
``<IMG_CONTEXT>`` count the processor puts between ``<img>`` and ``</img>``. The grid of an item
is its tile count. (The remote-code ``InternVLChatModel`` checkpoints are not this format.)

Why an adapter, not the generic path (:mod:`~encoder_pod.models.generic`): the generic path
opens the checkpoint's ``AutoProcessor``, and an InternVL checkpoint's needs torchvision,
which the pod does not install. This adapter runs ``GotOcr2ImageProcessorPil`` with the
tiling ``InternVLProcessor`` asks for, counts rows (tiles x ``image_seq_length``) from the
image size when an item is decoded, and reports ``[tiles]`` per item in ``item_grids``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from transformers import GotOcr2ImageProcessorPil, InternVLConfig, InternVLVisionConfig, Qwen2Config
from transformers.models.internvl.modeling_internvl import InternVLForConditionalGeneration, InternVLModel

from encoder_pod.models.base import MediaItem
from encoder_pod.models.family import FamilyCode, Layout
from encoder_pod.models.hosted import HostedImageAdapter
from encoder_pod.models.tiny_full import (
    VOCAB_SIZE,
    byte_tokenizer,
    image_processor_file,
    randomize_scaled,
    save_full,
    seed_of,
    token_ids,
)
from encoder_pod.models.vision import check_preset, flatten

_IMAGES_KWARGS = {"crop_to_patches": True}
"""``InternVLProcessor.images_kwargs``: the processor tiles whatever the saved image processor config says."""


class InternVLAdapter(HostedImageAdapter):
    """InternVL (``InternVLForConditionalGeneration``): tiles x ``image_seq_length`` rows per image."""

    name = "internvl"
    full_classes = {"InternVLForConditionalGeneration": InternVLForConditionalGeneration}
    parts = {"vision_tower": "model.vision_tower", "multi_modal_projector": "model.multi_modal_projector"}
    methods = {"get_image_features": InternVLModel.get_image_features, "pixel_shuffle": InternVLModel.pixel_shuffle}
    processor_cls = GotOcr2ImageProcessorPil

    @property
    def rows_per_tile(self) -> int:
        """Patches per tile after the pixel shuffle."""
        vision = self.config.vision_config
        side = _pair(vision.image_size)[0] // _pair(vision.patch_size)[0]
        return int((side * self.config.downsample_ratio) ** 2)

    def _check(self) -> None:
        side = _pair(self.config.vision_config.image_size)
        shape = self.probe_shape()[-2:]
        if shape != side:
            raise RuntimeError(f"the image processor config in {self.model_dir} gives {shape} tiles, the tower takes {side}")
        declared = getattr(self.config, "image_seq_length", None)
        if declared is not None and int(declared) != self.rows_per_tile:
            raise RuntimeError(f"{self.model_dir}: image_seq_length {declared} but a tile gives {self.rows_per_tile} rows")

    def tiles(self, width: int, height: int) -> int:
        """Tiles of an image (the image processor's own count, thumbnail included)."""
        return int(self.processor.get_number_of_image_patches(height, width, _IMAGES_KWARGS))

    def process(self, requests: Sequence[Sequence[MediaItem]]) -> Any:
        """One call, tiled as ``InternVLProcessor`` tiles (its ``crop_to_patches`` default wins over the config)."""
        return self.processor(
            images=flatten(requests), return_tensors="pt", input_data_format="channels_last", **_IMAGES_KWARGS
        )

    def rows(self, width: int, height: int) -> int:
        """Tiles times rows per tile."""
        return self.tiles(width, height) * self.rows_per_tile

    def feature_kwargs(self, out: Mapping[str, Any], requests: Sequence[Sequence[MediaItem]]) -> dict[str, Any]:
        return {"pixel_values": out["pixel_values"]}

    def grids(self, sizes: Sequence[tuple[int, int]], out: Mapping[str, Any]) -> list[list[int]]:
        """``[tiles]`` per image, as the image processor reports them."""
        return [[int(n)] for n in out["num_patches"]]


def _pair(value: Any) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[1]))


_SIDE, _PATCH = 32, 4  # 8x8 patches (+CLS), shuffled 0.5 -> 16 rows per tile
INTERNVL_TOKENS = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
                   "video_token": "<video>"}


def write_full(out: Path, preset: str = "tiny") -> None:
    """A whole random InternVL (its tower, projector, tiny Qwen2 LM), sharded, with tokenizer and processor files."""
    check_preset(preset)
    tokenizer = byte_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], INTERNVL_TOKENS, eos="<|im_end|>",
                               pad="<|endoftext|>")
    ids = token_ids(tokenizer, ["<|endoftext|>", "<|im_end|>", "<IMG_CONTEXT>"])
    vision = InternVLVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                  image_size=_SIDE, patch_size=_PATCH, use_mean_pooling=True, norm_type="layer_norm",
                                  use_qk_norm=False)
    text = Qwen2Config(vocab_size=VOCAB_SIZE, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                       pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])
    seq = (_SIDE // _PATCH) ** 2 // 4
    config = InternVLConfig(vision_config=vision.to_dict(), text_config=text.to_dict(), image_token_id=ids["<IMG_CONTEXT>"],
                            image_seq_length=seq, downsample_ratio=0.5, vision_feature_layer=-1,
                            vision_feature_select_strategy="default")
    model = InternVLForConditionalGeneration(config)
    randomize_scaled(model, seed_of("internvl"))
    # Saved with crop_to_patches off, as the -hf conversions save it: the processor switches it on.
    image_processor = GotOcr2ImageProcessorPil(size={"height": _SIDE, "width": _SIDE}, crop_to_patches=False,
                                               min_patches=1, max_patches=6)
    processor = {"processor_class": "InternVLProcessor", "image_seq_length": seq}
    save_full(out, model, tokenizer, {"preprocessor_config.json": image_processor_file(image_processor),
                                      "processor_config.json": processor})


INTERNVL_CODE = FamilyCode(adapters={Layout.FULL: InternVLAdapter}, write_tiny=lambda out, preset, layout: write_full(out, preset))
