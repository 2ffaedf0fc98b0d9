"""The generic path: any whole checkpoint whose transformers class has ``get_image_features``.

No family code: the model's own class, processor and feature method do the work.

- **Load.** The whole ``...ForConditionalGeneration`` is built on the meta device (no memory). Its
  encoder side is every child of the model (and of its inner ``model``) that does not hold the
  language model's input embeddings or output head: the vision tower, the projector or merger,
  their norms, lone parameters such as an ``image_newline``. Only those are built for real (the
  way the full model builds them), only their tensors are read out of the shards
  (:class:`~encoder_pod.models.parts.FullCheckpoint`, by transformers' own key renaming), and
  they are put back into the meta model. The language model stays on meta: a feature method that
  touched it would produce meta tensors, which loading checks for and refuses.
- **Rows.** ``model.get_image_features`` of the hybrid model, with the processor outputs it takes
  by name; ``pooler_output`` (transformers 5's merged rows) else ``last_hidden_state`` else the
  tensors returned, flattened to (rows, width).
- **Rows per item** are the family's own processor's placeholder count: the processor is called
  with one image placeholder per item, and the image token's occurrences in each text row are
  that item's rows. Loading encodes one image and refuses a checkpoint whose feature rows do not
  add up to the placeholders.
- **Failures.** Whatever fails while loading or warming up (a part that cannot be built, a
  tensor missing from the shards, a processor that cannot be opened, rows that do not add up) is
  raised as :class:`~encoder_pod.models.servable.CheckpointRefused` naming the model type and
  the reason: the pod exits with ``MODEL_LOAD_FAILED`` (3), as when the start-up check refuses a
  checkpoint; behind a data-parallel front the worker is not restarted (it would fail the same
  way), the pod exits 3 naming it.
- **Batching.** One processor call and one feature call for every item of the batch, where the
  processor's outputs concatenate; where they do not (ragged outputs), one call per item.

Hand-written adapters stay where they add what this cannot (tensor-parallel sharding, SGLang's
deepstack layout, tiles, audio windows, video); the registry uses this path for every other
checkpoint :func:`~encoder_pod.models.servable.refusal` accepts.
"""

from __future__ import annotations

import inspect
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Sequence

import torch
from torch import nn

from encoder_pod.errors import MediaError
from encoder_pod.modality import Modality
from encoder_pod.models.base import BaseAdapter, MediaItem, PreparedBatch
from encoder_pod.models.checkpoint import Checkpoint, Layout
from encoder_pod.models.parts import FullCheckpoint, PartModule, new_parameter, plan_keys
from encoder_pod.models.servable import CheckpointRefused, model_class
from encoder_pod.models.vision import flatten, health_image, image_size
from encoder_pod.models.weights import CheckpointError

log = logging.getLogger(__name__)

TEXT_KEYS = frozenset({"input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids", "position_ids"})
"""Processor outputs that belong to the prompt, never passed to a feature method."""


def generic_checkpoint(checkpoint_dir: Any, config: dict[str, Any]) -> Checkpoint:
    """The :class:`Checkpoint` of a whole checkpoint no family claims."""
    named = config.get("architectures") or []
    return Checkpoint(checkpoint_dir, str(config["model_type"]), Layout.FULL, str(config["model_type"]),
                      named[0] if named else None, config)


def _holds(module: nn.Module, target: nn.Module | None) -> bool:
    return target is not None and any(sub is target for sub in module.modules())


def encoder_part_paths(meta: Any) -> list[str]:
    """Module paths of the encoder side of a (meta) whole model; see the module docstring."""
    embeddings = meta.get_input_embeddings()
    head = meta.get_output_embeddings() if hasattr(meta, "get_output_embeddings") else None
    prefix = getattr(meta, "base_model_prefix", "")
    inner = getattr(meta, prefix, None) if prefix else None
    roots: list[tuple[str, nn.Module]] = [("", meta)]
    if isinstance(inner, nn.Module) and inner is not meta:
        roots.append((prefix, inner))
    paths: list[str] = []
    for root_path, root in roots:
        for name, child in root.named_children():
            if child is inner or _holds(child, embeddings) or _holds(child, head):
                continue
            if not any(True for _ in child.parameters()):
                continue
            paths.append(f"{root_path}.{name}" if root_path else name)
        for name, _ in root.named_parameters(recurse=False):
            paths.append(f"{root_path}.{name}" if root_path else name)
    if not paths:
        raise CheckpointError(f"{type(meta).__name__} has no module besides its language model")
    return paths


def feature_rows(output: Any) -> torch.Tensor:
    """(rows, width) of what a feature method returned (see the module docstring)."""
    for attr in ("pooler_output", "last_hidden_state"):
        value = getattr(output, attr, None)
        if value is not None:
            output = value
            break
    if isinstance(output, torch.Tensor):
        return output.reshape(-1, output.shape[-1])
    if isinstance(output, (list, tuple)) and output and all(isinstance(t, torch.Tensor) for t in output):
        return torch.cat([t.reshape(-1, t.shape[-1]) for t in output])
    raise CheckpointError(f"the feature method returned {type(output).__name__}, not rows")


@dataclass(frozen=True)
class _Prompt:
    """How the processor is told "one image here" and how its expansion is counted."""

    placeholder: str
    token_id: int


def _prompt(processor: Any) -> _Prompt:
    tokenizer = getattr(processor, "tokenizer", None)
    placeholder = getattr(processor, "image_token", None) or getattr(tokenizer, "image_token", None)
    token_id = getattr(processor, "image_token_id", None)
    if token_id is None and isinstance(placeholder, str) and tokenizer is not None:
        token_id = tokenizer.convert_tokens_to_ids(placeholder)
    if not isinstance(placeholder, str) or not isinstance(token_id, int):
        raise CheckpointError(f"{type(processor).__name__} names no image token (image_token / image_token_id)")
    return _Prompt(placeholder, token_id)


class GenericAdapter(BaseAdapter):
    """Serves images through the checkpoint's own ``get_image_features`` (module docstring)."""

    name: ClassVar[str] = "generic"
    modalities: ClassVar[frozenset[Modality]] = frozenset({Modality.IMAGE})

    full_class: ClassVar[Any]
    """The checkpoint's transformers class, as :func:`~encoder_pod.models.servable.model_class` finds it."""

    model: Any
    processor: Any

    @classmethod
    def for_checkpoint(cls, checkpoint: Checkpoint) -> type["GenericAdapter"]:
        """A subclass named after the checkpoint's model type (``/server_info``'s family), carrying its class.

        The class is :func:`~encoder_pod.models.servable.model_class`'s, the lookup the start-up
        check (:func:`~encoder_pod.models.servable.refusal`) made its decision with.
        """
        full = model_class(checkpoint.config)
        if full is None or not hasattr(full, "get_image_features"):
            raise CheckpointRefused(checkpoint.model_type, "no transformers class of it has get_image_features")
        return type(f"Generic_{checkpoint.model_type}", (cls,), {"name": checkpoint.model_type, "full_class": full})

    @classmethod
    def weight_keys(cls, checkpoint: Checkpoint, keys: Sequence[str]) -> list[str]:
        """The keys of the encoder side (what a download limited to the encoder fetches)."""
        from encoder_pod.models.parts import meta_model

        config = cls.full_class.config_class.from_pretrained(checkpoint.path)
        meta = meta_model(cls.full_class, config)
        return plan_keys(cls.full_class, config, keys, encoder_part_paths(meta), meta=meta).keys()

    @contextmanager
    def _refusing(self) -> Iterator[None]:
        """Any failure inside as :class:`CheckpointRefused` (see the module docstring)."""
        try:
            yield
        except CheckpointRefused:
            raise
        except Exception as exc:
            reason = f"the generic path cannot load it: {type(exc).__name__}: {' '.join(str(exc).split())}"
            raise CheckpointRefused(self.checkpoint.model_type, reason) from exc

    def load(self) -> None:
        """Build the model on meta, load its encoder side only, open its processor, encode one image."""
        with self._refusing():
            self._load()

    def warmup(self) -> None:
        """The base warm-up encode, a failure of which refuses the checkpoint as a failed load does."""
        with self._refusing():
            super().warmup()

    def _load(self) -> None:
        from transformers import AutoProcessor

        full = self.full_class
        checkpoint = FullCheckpoint(self.model_dir, full, full.config_class.from_pretrained(self.model_dir))
        meta: Any = checkpoint.meta
        paths = encoder_part_paths(meta)
        parts = {path: self._build(checkpoint, path) for path in paths}
        self.weights = checkpoint.load(parts)
        for path, part in parts.items():
            parent_path, _, leaf = path.rpartition(".")
            parent = meta.get_submodule(parent_path) if parent_path else meta
            moved: Any = part.to(self.device)
            if isinstance(part, nn.Parameter):
                moved = nn.Parameter(moved.detach(), requires_grad=False)
            setattr(parent, leaf, moved)
            parts[path] = moved
        self.parts = parts
        self.model = meta.eval()
        self.processor = AutoProcessor.from_pretrained(self.model_dir)
        self.prompt = _prompt(self.processor)
        self._accepts = inspect.signature(self.model.get_image_features).parameters
        batch = self.preprocess([[health_image()]])
        probe = self.forward(batch)
        if probe.device.type == "meta":
            raise CheckpointError(f"{full.__name__}.get_image_features uses the language model, which is not loaded")
        placeholders = sum(sum(counts) for counts in batch.item_tokens)
        if probe.shape[0] != placeholders:
            raise CheckpointError(
                f"{full.__name__}.get_image_features gives {probe.shape[0]} rows for one image, but its processor "
                f"puts {placeholders} {self.prompt.placeholder} placeholders in the prompt"
            )
        self._width = int(probe.shape[-1])
        log.info("generic %s encoder: parts %s, width %d", self.name, paths, self._width)

    def _build(self, checkpoint: FullCheckpoint, path: str) -> PartModule:
        try:
            return checkpoint.build_like(path, self.dtype)
        except Exception:
            # Not buildable from the whole config alone: an empty copy of the meta module,
            # every tensor of which the checkpoint then fills (non-persistent buffers refused).
            template = checkpoint.meta.get_submodule(path)
            if isinstance(template, nn.Parameter):
                return new_parameter(template.shape, self.dtype)
            persistent = set(template.state_dict())
            transient = [name for name, _ in template.named_buffers() if name not in persistent]
            if transient:
                raise
            import copy

            return copy.deepcopy(template).to_empty(device="cpu").to(self.dtype).eval()

    # --- serving ----------------------------------------------------------------------------
    def _call_processor(self, images: Sequence[Any]) -> Any:
        texts = [self.prompt.placeholder for _ in images]
        return self.processor(text=texts, images=list(images), return_tensors="pt", padding=True)

    def _counts(self, encoded: Any, n: int) -> list[int]:
        ids = encoded["input_ids"]
        counts = [int((row == self.prompt.token_id).sum()) for row in ids]
        if len(counts) != n:
            raise CheckpointError(f"the processor returned {len(counts)} prompts for {n} images")
        return counts

    def measure(self, item: MediaItem) -> int:
        """The processor's placeholder count for this one image."""
        image_size(item, self.modalities)
        try:
            encoded = self._call_processor(flatten([[item]]))
        except (ValueError, TypeError) as exc:
            raise MediaError(f"the processor refused the image: {exc}") from exc
        return self._counts(encoded, 1)[0]

    def preprocess(self, requests: Sequence[Sequence[MediaItem]]) -> PreparedBatch:
        """One processor call for the whole batch (one per item where the outputs do not concatenate)."""
        images = flatten(requests)
        try:
            calls = [self._call_processor(images)]
        except (ValueError, RuntimeError):
            calls = [self._call_processor([image]) for image in images]
        counts = [count for encoded in calls for count in self._counts(encoded, len(encoded["input_ids"]))]
        inputs = {"calls": [self._feature_inputs(encoded) for encoded in calls]}
        per_request: list[list[int]] = []
        start = 0
        for items in requests:
            per_request.append(counts[start : start + len(items)])
            start += len(items)
        return PreparedBatch(inputs=inputs, item_tokens=per_request, item_grids=[[[c] for c in r] for r in per_request])

    def _feature_inputs(self, encoded: Any) -> dict[str, Any]:
        keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in self._accepts.values())
        chosen: dict[str, Any] = {}
        for key, value in encoded.items():
            if key in TEXT_KEYS or not (key in self._accepts or keyword):
                continue
            if isinstance(value, torch.Tensor):
                value = value.to(self.device, dtype=self.dtype if value.is_floating_point() else None)
            chosen[key] = value
        return chosen

    @torch.inference_mode()
    def forward(self, batch: PreparedBatch) -> torch.Tensor:
        """The feature method on each processor call's outputs, rows concatenated in item order."""
        rows = [feature_rows(self.model.get_image_features(**inputs)) for inputs in batch.inputs["calls"]]
        return torch.cat(rows) if len(rows) > 1 else rows[0]

    def health_item(self, modality: Modality) -> MediaItem:
        """A 32x32 image."""
        if modality not in self.modalities:
            raise ValueError(f"{self.name} has no {modality.value} health item")
        return health_image()

    @property
    def hidden_size(self) -> int:
        """Width of the feature method's rows (measured at load)."""
        return self._width

    def encoder_modules(self) -> list[torch.nn.Module | torch.nn.Parameter]:
        """The loaded encoder parts (never the meta language model)."""
        return list(self.parts.values())
