"""CLIP and SigLIP vision towers, LLaVA-style: a fixed number of patch rows per image.

Output choices (what a LLaVA-family language model consumes, not the contrastive embedding):

- CLIP: the penultimate layer's patch tokens without CLS, i.e. LLaVA's ``vision_feature_layer=-2``
  with the ``default`` select strategy: ``hidden_states[-2][:, 1:]``. Rows per image =
  ``(image_size / patch_size) ** 2`` (576 for CLIP-L/14-336). The last encoder layer is dropped
  after the strict load, so it is never computed (``last_hidden_state`` then *is* the penultimate
  layer's output; CLIP applies ``post_layernorm`` only to the pooled CLS, which is not served). A
  ``CLIPVisionModelWithProjection`` checkpoint is loaded with that class so its projection weight
  is accounted for, but the projection (a pooled, contrastive output) is not used.
- SigLIP: ``last_hidden_state`` (all layers, ``post_layernorm`` applied; SigLIP has no CLS), as
  PaliGemma consumes it. The attention-pooling head is loaded but switched off. A tower that must
  end earlier (LLaVA-OneVision drops the last layer) is saved with fewer layers in its config.

Images are prepared exactly as the checkpoint's processor config says (CLIP: shortest edge then
center crop; SigLIP: plain resize). LLaVA-1.5's pad-to-square is a client-side choice, not done here.

Why an adapter, not the generic path (:mod:`~encoder_pod.models.generic`): these checkpoints are
towers saved alone (``CLIPVisionModel``, ``SiglipVisionModel``, ``...WithProjection``): no
multimodal class, so no ``get_image_features`` to call and no processor placeholder to count
rows by; the rows are LLaVA's choice of layer (above), CLIP's last layer dropped so that it is
never computed; and tensor parallel splits these towers (``parallel/tensor/plans.py``).
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, ClassVar, Sequence

import torch
from PIL import Image
from transformers import CLIPImageProcessorPil, SiglipImageProcessorPil
from transformers.models.clip.configuration_clip import CLIPVisionConfig
from transformers.models.clip.modeling_clip import CLIPVisionModel, CLIPVisionModelWithProjection
from transformers.models.siglip.configuration_siglip import SiglipVisionConfig
from transformers.models.siglip.modeling_siglip import SiglipVisionModel

from encoder_pod.models.base import MediaItem, PreparedBatch
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

CLIP_FEATURE_LAYER = -2
"""LLaVA's ``vision_feature_layer``: index into ``hidden_states`` (embeddings, then every layer)."""

# A non-square probe: a processor config that keeps the aspect ratio (no crop) shows up at load.
_PROBE_SIZE = (37, 53)

_TOWER = {
    # 32 px images, 8 px patches: 16 rows per image; 3 layers so the CLIP cut leaves 2.
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "image_size": 32,
        "patch_size": 8,
    },
    # /16 224 px, hidden 384, 4 layers: 196 rows per image (the benchmarks' size, docs/benchmarks.md).
    "moderate": {
        "hidden_size": 384,
        "intermediate_size": 1536,
        "num_hidden_layers": 4,
        "num_attention_heads": 6,
        "image_size": 224,
        "patch_size": 16,
    },
}


def _side_pair(value: Any) -> tuple[int, int]:
    """(height, width) from a config's ``image_size``/``patch_size`` (an int or a pair)."""
    return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[1]))


class _FixedGridAdapter(VisionAdapter):
    """Towers whose processor gives every image the same size, hence the same rows."""

    model_classes: ClassVar[dict[str, type]]
    """Architecture name -> class; the first is used when config.json names none."""
    processor_cls: ClassVar[type[Any]]

    rows_per_image: int

    def load(self) -> None:
        """The class named by config.json (strict weights), the PIL processor by name."""
        # By name: AutoImageProcessor would look for the torchvision variant first and warn.
        self.processor = self.processor_cls.from_pretrained(self.model_dir)
        # Discovery accepted the class config.json names (or it names none: the first one).
        model_cls = self.model_classes[self.checkpoint.architecture or next(iter(self.model_classes))]
        self.model = self._load_checked(model_cls)
        self.tower = self._select_output(self.model)
        self.rows_per_image = self._check_processor()

    def _select_output(self, model: Any) -> Any:
        """Trim the loaded model to the served output; returns the module ``forward`` calls."""
        raise NotImplementedError

    def _rows(self, hidden: torch.Tensor) -> torch.Tensor:
        """(images, tokens, hidden) -> the served rows per image."""
        return hidden

    def _check_processor(self) -> int:
        """Rows per image; refuses a processor whose output size does not fit the position embeddings."""
        config = self.tower.config
        expected = _side_pair(config.image_size)
        got = tuple(self._process([Image.new("RGB", _PROBE_SIZE)])["pixel_values"].shape[-2:])
        if got != expected:
            raise RuntimeError(
                f"preprocessor_config.json in {self.model_dir} gives {got[0]}x{got[1]} images from a "
                f"{_PROBE_SIZE[1]}x{_PROBE_SIZE[0]} probe, but the tower expects {expected[0]}x{expected[1]}"
            )
        # Both families serve exactly the patch tokens (CLIP's CLS is dropped in _rows).
        patch = _side_pair(config.patch_size)
        return (expected[0] // patch[0]) * (expected[1] // patch[1])

    def measure(self, item: MediaItem) -> int:
        """Every accepted image gives the same rows (the processor resizes to one size)."""
        image_size(item, self.modalities)
        return self.rows_per_image

    def preprocess(self, requests: Sequence[Sequence[MediaItem]]) -> PreparedBatch:
        """One processor call: (images, 3, H, W)."""
        images = flatten(requests)
        pixels = self._process(images)["pixel_values"]
        return PreparedBatch(
            inputs={"pixel_values": pixels},
            item_tokens=regroup([self.rows_per_image] * len(images), requests),
            # No grid for fixed-size towers: the row count says everything.
            item_grids=regroup([[] for _ in images], requests),
        )

    def forward(self, batch: PreparedBatch) -> torch.Tensor:
        """One forward; returns the served rows of every image, flattened in item order."""
        with torch.inference_mode():
            pixels = batch.inputs["pixel_values"].to(self.device, self.dtype)
            hidden = self._rows(self.tower(pixel_values=pixels).last_hidden_state)
            return hidden.reshape(-1, hidden.shape[-1])

    @property
    def hidden_size(self) -> int:
        """Width of a patch row."""
        return int(self.tower.config.hidden_size)



class CLIPAdapter(_FixedGridAdapter):
    """CLIP vision tower (``clip_vision_model``), penultimate-layer patch tokens without CLS."""

    name = "clip"
    model_classes = {
        "CLIPVisionModel": CLIPVisionModel,
        "CLIPVisionModelWithProjection": CLIPVisionModelWithProjection,
    }
    processor_cls = CLIPImageProcessorPil

    def _select_output(self, model: Any) -> Any:
        tower = model.vision_model if isinstance(model, CLIPVisionModelWithProjection) else model
        layers = tower.encoder.layers
        # hidden_states[k] (k < 0) is the output after len(layers) + 1 + k layers: keep just those.
        keep = len(layers) + 1 + CLIP_FEATURE_LAYER
        if keep < 1:
            raise RuntimeError(
                f"a CLIP tower with {len(layers)} layers has no hidden_states[{CLIP_FEATURE_LAYER}]"
            )
        tower.encoder.layers = layers[:keep]
        return tower

    def _rows(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden[:, 1:]  # drop CLS (LLaVA's "default" feature select strategy)


class SiglipAdapter(_FixedGridAdapter):
    """SigLIP vision tower (``siglip_vision_model``), last_hidden_state (no CLS exists)."""

    name = "siglip"
    model_classes = {"SiglipVisionModel": SiglipVisionModel}
    processor_cls = SiglipImageProcessorPil

    def _select_output(self, model: Any) -> Any:
        # The attention-pooling head makes the pooled (contrastive) output, which is not served:
        # its weights were loaded (strictness), its compute is skipped.
        model.use_head = False
        return model


def _write(family: str, out: Path, model: Any, processor: Any) -> None:
    """Seeded random weights for ``model`` plus ``processor``'s config, config.json last."""
    randomize(model, seed=zlib.crc32(f"{family}:{type(model).__name__}".encode()))

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)

    save_atomically(out, write)


def write_clip(out: Path, preset: str = "tiny", *, with_projection: bool = False) -> None:
    """Write a CLIP tower, optionally as ``CLIPVisionModelWithProjection`` (what some LLaVAs ship)."""
    check_preset(preset)
    side = _TOWER[preset]["image_size"]
    processor = CLIPImageProcessorPil(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    model_cls = CLIPVisionModelWithProjection if with_projection else CLIPVisionModel
    config = CLIPVisionConfig(projection_dim=32 if preset == "tiny" else 512, **_TOWER[preset])
    _write(CLIPAdapter.name, out, model_cls(config), processor)


def write_siglip(out: Path, preset: str = "tiny") -> None:
    """A ``SiglipVisionModel`` checkpoint (with its pooling head) and a ``SiglipImageProcessorPil`` config."""
    check_preset(preset)
    side = _TOWER[preset]["image_size"]
    processor = SiglipImageProcessorPil(size={"height": side, "width": side})
    _write(SiglipAdapter.name, out, SiglipVisionModel(SiglipVisionConfig(**_TOWER[preset])), processor)


CLIP_CODE = FamilyCode(
    adapters={Layout.TOWER: CLIPAdapter},
    write_tiny=lambda out, preset, layout: write_clip(out, preset, with_projection=False),
)
SIGLIP_CODE = FamilyCode(adapters={Layout.TOWER: SiglipAdapter}, write_tiny=lambda out, preset, layout: write_siglip(out, preset))
