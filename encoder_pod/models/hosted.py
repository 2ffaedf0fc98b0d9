"""Image families whose rows come from their own ``XModel.get_image_features``, run without a language model.

LLaVA-1.5, LLaVA-NeXT, LLaVA-OneVision, Gemma 3 and InternVL each define, in transformers, the
rows their language model splices in as one method of their ``...Model``: the vision tower's
chosen feature layer and select strategy, the projector, and (NeXT, OneVision) the anyres packing
with ``image_newline``. :class:`HostedImageAdapter` reads exactly the parts that method touches
(``model.vision_tower``, ``model.multi_modal_projector``, ...) out of the whole checkpoint, puts
them on a :class:`~encoder_pod.models.parts.Host` under the attribute names the method uses, and
runs the family's own (unbound) method on it: the rows are the full model's, by the same code.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Mapping, Sequence

import torch
from PIL import Image

from encoder_pod.models.base import MediaItem, PreparedBatch
from encoder_pod.models.parts import FullLayout, host_class
from encoder_pod.models.vision import VisionAdapter, flatten, image_size, regroup

PROBE_SIZE = (37, 53)
"""A non-square probe image: a processor config that does not resize as the tower needs shows up at load."""


class HostedImageAdapter(FullLayout, VisionAdapter):
    """IMAGE items through a family's own ``get_image_features`` on the parts read out of its checkpoint."""

    parts: ClassVar[Mapping[str, str]]
    """Attribute name on the host -> module path in the full model (``vision_tower`` -> ``model.vision_tower``)."""
    methods: ClassVar[Mapping[str, Callable[..., Any]]]
    """The family's unbound ``XModel`` methods the host carries (``get_image_features`` first)."""
    processor_cls: ClassVar[type[Any]]
    """The family's PIL image processor class (loaded by name: no torchvision)."""

    host: Any  # a Host: transformers modules type their children loosely
    config: Any

    @classmethod
    def part_paths(cls, checkpoint: Any) -> tuple[str, ...]:
        return tuple(cls.parts.values())

    def load(self) -> None:
        """Parts (strict, only their tensors), the host around them, the processor; then family checks."""
        full = self.open_checkpoint()
        self.config = full.config
        built = {name: full.build_like(path, self.dtype) for name, path in self.parts.items()}
        self.weights = full.load({self.parts[name]: module for name, module in built.items()})
        host_cls = host_class(f"{type(self).__name__}Host", **self.methods)
        self.host = host_cls(self.config, **built).to(self.device).eval()
        self.tower = self.host.vision_tower  # what tensor parallel shards (CLIP / SigLIP blocks)
        self.processor = self.processor_cls.from_pretrained(self.model_dir)
        self._check()

    def _check(self) -> None:
        """Refuse a processor config that does not fit the model (family specifics)."""

    def encoder_modules(self) -> list[Any]:
        """Every part on the host."""
        return [getattr(self.host, name) for name in self.parts]

    # --- the family's rows ------------------------------------------------------------------------
    def rows(self, width: int, height: int) -> int:
        """Rows of one image of ``width`` x ``height`` (the processor's placeholder count)."""
        raise NotImplementedError

    def feature_kwargs(self, out: Mapping[str, Any], requests: Sequence[Sequence[MediaItem]]) -> dict[str, Any]:
        """``get_image_features`` arguments from the processor's output."""
        return {"pixel_values": out["pixel_values"]}

    def process(self, requests: Sequence[Sequence[MediaItem]]) -> Any:
        """ONE image processor call for the batch."""
        return self._process(flatten(requests))

    def measure(self, item: MediaItem) -> int:
        """The image's rows, from its size alone."""
        width, height = image_size(item, self.modalities)
        return self.rows(width, height)

    def preprocess(self, requests: Sequence[Sequence[MediaItem]]) -> PreparedBatch:
        """One processor call; rows per image by the family's rule."""
        out = self.process(requests)
        sizes = [item.data.size for items in requests for item in items]
        tokens = self.batch_rows(sizes, requests)
        return PreparedBatch(
            inputs=self.feature_kwargs(out, requests),
            item_tokens=regroup(tokens, requests),
            item_grids=regroup(self.grids(sizes, out), requests),
        )

    def batch_rows(self, sizes: Sequence[tuple[int, int]], requests: Sequence[Sequence[MediaItem]]) -> list[int]:
        """Rows per image of the batch (in item order)."""
        return [self.rows(width, height) for width, height in sizes]

    def grids(self, sizes: Sequence[tuple[int, int]], out: Mapping[str, Any]) -> list[list[int]]:
        """Per image: what the prefill side may want besides the row count (none by default)."""
        return [[] for _ in sizes]

    def forward(self, batch: PreparedBatch) -> torch.Tensor:
        """The family's ``get_image_features``; its per-image rows concatenated in item order."""
        with torch.inference_mode():
            inputs = {
                key: value.to(self.device, self.dtype) if key == "pixel_values" else _to(value, self.device)
                for key, value in batch.inputs.items()
            }
            pooled = self.host.get_image_features(**inputs).pooler_output
            if isinstance(pooled, torch.Tensor):
                return pooled.reshape(-1, pooled.shape[-1])
            return torch.cat([rows.reshape(-1, rows.shape[-1]) for rows in pooled])

    @property
    def hidden_size(self) -> int:
        """The language model's width (the projector's output)."""
        return int(self.config.get_text_config().hidden_size)

    def probe_shape(self) -> tuple[int, ...]:
        """Shape of the processor's pixel_values for one probe image."""
        return tuple(self._process([Image.new("RGB", PROBE_SIZE)])["pixel_values"].shape)


def _to(value: Any, device: torch.device) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value
