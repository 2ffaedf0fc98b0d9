"""The pieces of the per-family proofs: test items, checks, the full HF model, and the Qwen vision reference.

``reference`` functions run the whole ``...ForConditionalGeneration`` (``from_pretrained`` of the same
tiny checkpoint) and return, per item, the rows its ``get_image_features`` / ``get_audio_features``
computes: the rows its language model splices in at the item's placeholders. ``placeholders``
functions run the family's real processor on one prompt per request and count the placeholder
tokens it expands. Neither uses any of the pod's code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from PIL import Image

from tests.support import hf_processors
from tests.support.media_files import audio_bytes, data_uri, tone
from testkit.media import png_data_uri


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
class Check:
    """One modality of a family's proof: requests (several sizes, several items), reference rows, placeholders."""

    modality: str
    requests: Sequence[Sequence[Item]]
    reference: Callable[[Any, Path, list[list[Any]]], list[torch.Tensor]]
    """(full model, checkpoint, media per request) -> the rows of each item, in item order."""
    placeholders: Callable[[Path, list[list[Any]]], list[int]]
    """(checkpoint, media per request) -> placeholder tokens in one prompt per request holding its items."""
    width: Callable[[Any], int] = lambda config: int(config.get_text_config().hidden_size)

    def media(self) -> list[list[Any]]:
        """The decoded items, per request."""
        return [[item.media(self.modality) for item in request] for request in self.requests]


@dataclass(frozen=True)
class Case:
    """One family: its whole-model class, what of the checkpoint is the encoder, and its checks."""

    arch: str
    full_cls: str
    checks: Sequence[Check]
    tower_prefixes: tuple[str, ...]
    """Checkpoint key prefixes of tower + projector, as the hub's files name them."""
    env: dict[str, str] = field(default_factory=dict)

    @property
    def modules(self) -> tuple[str, ...]:
        """Module paths of tower + projector in the full model (what /server_info counts parameters of)."""
        return MODULES[self.arch]


MODULES = {
    **dict.fromkeys(("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"), ("model.visual",)),
    **dict.fromkeys(("llava", "gemma3", "internvl"), ("model.vision_tower", "model.multi_modal_projector")),
    **dict.fromkeys(("llava_next", "llava_onevision"),
                    ("model.vision_tower", "model.multi_modal_projector", "model.image_newline")),
    **dict.fromkeys(("qwen2_5_omni", "qwen3_omni"), ("thinker.model.visual", "thinker.model.audio_tower")),
    "qwen2_audio": ("model.audio_tower", "model.multi_modal_projector"),
    "whisper": ("model.encoder",),
}


def case(arch: str, full_cls: str, modality: str, requests: Sequence[Sequence[Item]], reference: Any,
         placeholders: Any, tower_prefixes: tuple[str, ...], **kwargs: Any) -> Case:
    """A one-modality :class:`Case`."""
    return Case(arch, full_cls, [Check(modality, requests, reference, placeholders, **kwargs)], tower_prefixes)


@lru_cache(maxsize=4)
def full_model(full_cls: str, ckpt: Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Any:
    """The whole HF model from the tiny checkpoint, fp32 on CPU by default (a few are kept for the session)."""
    import transformers

    return getattr(transformers, full_cls).from_pretrained(ckpt, dtype=dtype).to(device).eval()


def on(model: Any, inputs: Any) -> dict[str, Any]:
    """``inputs`` moved to the model's device, float tensors in its dtype (the references run where it runs)."""
    moved = {}
    for key, value in dict(inputs).items():
        if isinstance(value, torch.Tensor):
            value = value.to(model.device, model.dtype if value.is_floating_point() else None)
        moved[key] = value
    return moved


# --- Qwen vision -------------------------------------------------------------------------------

def flat(requests: list[list[Any]]) -> list[Any]:
    return [item for request in requests for item in request]


def qwen_reference(model: Any, ckpt: Path, requests: list[list[Any]]) -> list[torch.Tensor]:
    from transformers import Qwen2VLImageProcessorPil

    images = flat(requests)
    out = Qwen2VLImageProcessorPil.from_pretrained(ckpt)(images=images, return_tensors="pt")
    owner = getattr(model, "thinker", model)
    with torch.inference_mode():
        out = on(model, out)
        features = owner.get_image_features(out["pixel_values"], out["image_grid_thw"])
    deepstack = getattr(features, "deepstack_features", None) or []
    return [torch.cat([rows, *(layer[i] for layer in deepstack)], dim=1) for i, rows in enumerate(features.pooler_output)]


def qwen_placeholders(processor_cls: str, token: str = "<|image_pad|>", start: str = "<|vision_start|>",
                       end: str = "<|vision_end|>") -> Callable[[Path, list[Any]], list[int]]:
    def count(ckpt: Path, requests: list[list[Any]]) -> list[int]:
        import transformers
        from transformers import Qwen2VLImageProcessorPil

        tok = hf_processors.tokenizer(ckpt)
        processor = hf_processors.without_video(getattr(transformers, processor_cls))(
            image_processor=Qwen2VLImageProcessorPil.from_pretrained(ckpt), tokenizer=tok
        )
        prompts = [f"<|im_start|>user\n{f'{start}{token}{end}' * len(r)}hi<|im_end|>" for r in requests]
        out = processor(text=prompts, images=flat(requests), return_tensors="pt", padding=True)
        return hf_processors.count(out["input_ids"], tok.convert_tokens_to_ids(token))

    return count


QWEN_REQUESTS = [
    [Item((56, 56), 1)],
    [Item((100, 140), 2), Item((224, 168), 3)],
    [Item((300, 200), 4), Item((90, 60), 5), Item((64, 64), 6)],
]

QWEN3_REQUESTS = [
    [Item((64, 64), 1)],
    [Item((100, 140), 2), Item((256, 192), 3)],
    [Item((300, 200), 4), Item((90, 60), 5)],
]


def deepstack_width(config: Any) -> int:
    vision = config.vision_config
    return int(vision.out_hidden_size) * (1 + len(getattr(vision, "deepstack_visual_indexes", None) or []))


def processor_kwargs(ckpt: Path) -> dict[str, Any]:
    """The processor-level settings the checkpoint's processor_config.json holds."""
    kwargs = json.loads((ckpt / "processor_config.json").read_text())
    kwargs.pop("processor_class", None)
    return kwargs
