"""Per family: the inputs a test sends, and what the family's own HF code says the answer is.

``reference`` runs the whole ``...ForConditionalGeneration`` (``from_pretrained`` of the same tiny
checkpoint) and returns, per item, the rows its ``get_image_features`` / ``get_audio_features``
computes: the rows its language model splices in at the item's placeholders. ``placeholders`` runs
the family's real processor on one prompt per item and counts the placeholder tokens it expands.
Neither uses any of the pod's code.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from PIL import Image

from tests.support import hf_processors
from tests.support.media_files import audio_bytes, data_uri, tone
from tests.support.server import png_data_uri


def image(width: int, height: int, seed: int) -> Image.Image:
    """The noise image :func:`png_data_uri` encodes (PNG: lossless, so the pod decodes these pixels)."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, size=(height, width, 3), dtype=np.uint8))


@dataclass(frozen=True)
class Item:
    """One media item of a test request: an image size or an audio length, and its seed."""

    size: tuple[int, int] | float
    seed: int

    def media(self, modality: str) -> Any:
        """The decoded item as the pod will see it (PIL image, or 16 kHz float32 samples)."""
        if modality == "IMAGE":
            width, height = self.size  # type: ignore[misc]
            return image(width, height, self.seed)
        return tone(float(self.size), 16_000, self.seed)  # type: ignore[arg-type]

    def uri(self, modality: str) -> str:
        """The item as the request carries it."""
        if modality == "IMAGE":
            width, height = self.size  # type: ignore[misc]
            return png_data_uri(width, height, seed=self.seed)
        return data_uri(audio_bytes(self.media(modality), 16_000), "audio/wav")


@dataclass(frozen=True)
class Case:
    """One family's proof: requests (several sizes, several items), reference rows, placeholder counts."""

    arch: str
    full_cls: str
    modality: str
    requests: Sequence[Sequence[Item]]
    reference: Callable[[Any, Path, list[Any]], list[torch.Tensor]]
    """(full model, checkpoint, media) -> the rows of each item."""
    placeholders: Callable[[Path, list[Any]], list[int]]
    tower_prefixes: tuple[str, ...]
    """Checkpoint key prefixes of tower + projector, as the hub's files name them."""
    width: Callable[[Any], int] = lambda config: int(config.get_text_config().hidden_size)
    env: dict[str, str] = field(default_factory=dict)

    def items(self) -> list[Item]:
        """Every item of every request, in order."""
        return [item for request in self.requests for item in request]


@lru_cache(maxsize=4)
def full_model(full_cls: str, ckpt: Path) -> Any:
    """The whole HF model, fp32 on CPU, from the tiny checkpoint (a few are kept for the session)."""
    import transformers

    return getattr(transformers, full_cls).from_pretrained(ckpt, dtype=torch.float32).eval()


# --- Qwen vision -------------------------------------------------------------------------------

def _qwen_reference(model: Any, ckpt: Path, images: list[Any]) -> list[torch.Tensor]:
    from transformers import Qwen2VLImageProcessorPil

    out = Qwen2VLImageProcessorPil.from_pretrained(ckpt)(images=images, return_tensors="pt")
    owner = getattr(model, "thinker", model)
    with torch.inference_mode():
        features = owner.get_image_features(out["pixel_values"], out["image_grid_thw"])
    deepstack = getattr(features, "deepstack_features", None) or []
    return [torch.cat([rows, *(layer[i] for layer in deepstack)], dim=1) for i, rows in enumerate(features.pooler_output)]


def _qwen_placeholders(processor_cls: str, token: str = "<|image_pad|>", start: str = "<|vision_start|>",
                       end: str = "<|vision_end|>") -> Callable[[Path, list[Any]], list[int]]:
    def count(ckpt: Path, images: list[Any]) -> list[int]:
        import transformers
        from transformers import Qwen2VLImageProcessorPil

        tok = hf_processors.tokenizer(ckpt)
        processor = hf_processors.without_video(getattr(transformers, processor_cls))(
            image_processor=Qwen2VLImageProcessorPil.from_pretrained(ckpt), tokenizer=tok
        )
        prompts = [f"<|im_start|>user\n{start}{token}{end}hi<|im_end|>"] * len(images)
        out = processor(text=prompts, images=images, return_tensors="pt", padding=True)
        return hf_processors.count(out["input_ids"], tok.convert_tokens_to_ids(token))

    return count


_QWEN_REQUESTS = [
    [Item((56, 56), 1)],
    [Item((100, 140), 2), Item((224, 168), 3)],
    [Item((300, 200), 4), Item((90, 60), 5), Item((64, 64), 6)],
]

_QWEN3_REQUESTS = [
    [Item((64, 64), 1)],
    [Item((100, 140), 2), Item((256, 192), 3)],
    [Item((300, 200), 4), Item((90, 60), 5)],
]


def _deepstack_width(config: Any) -> int:
    vision = config.vision_config
    return int(vision.out_hidden_size) * (1 + len(getattr(vision, "deepstack_visual_indexes", None) or []))


CASES: dict[str, Case] = {
    "qwen2_vl": Case("qwen2_vl", "Qwen2VLForConditionalGeneration", "IMAGE", _QWEN_REQUESTS, _qwen_reference,
                     _qwen_placeholders("Qwen2VLProcessor"), ("visual.",)),
    "qwen2_5_vl": Case("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "IMAGE", _QWEN_REQUESTS,
                       _qwen_reference, _qwen_placeholders("Qwen2_5_VLProcessor"), ("visual.",)),
    "qwen3_vl": Case("qwen3_vl", "Qwen3VLForConditionalGeneration", "IMAGE", _QWEN3_REQUESTS, _qwen_reference,
                     _qwen_placeholders("Qwen3VLProcessor"), ("model.visual.",), width=_deepstack_width),
    "qwen3_5": Case("qwen3_5", "Qwen3_5ForConditionalGeneration", "IMAGE", _QWEN3_REQUESTS, _qwen_reference,
                    _qwen_placeholders("Qwen3VLProcessor"), ("model.visual.",), width=_deepstack_width),
}
