"""The encoder side of a whole multimodal checkpoint: which tensors are its tower and projector.

Checkpoints on the hub name their tensors in several layouts for the same model (llava-hf ships
``vision_tower.vision_model.*``, the InternVL ``-hf`` conversions ``model.vision_tower.*``, Qwen2-VL
``visual.*`` while its module is ``model.visual``); ``from_pretrained`` maps each of them with the
renaming rules transformers keeps per model class. Those rules are used here as they are: the full
``...ForConditionalGeneration`` is built on the meta device (no memory, no weights), every key of
the index is mapped to its module path the way loading would map it, and the keys that land
under the wanted parts (``model.visual``, ``model.multi_modal_projector`` ...) are the ones read.
The language model is never built on a real device, and its tensors are never read.

Loading is strict per part: a tensor the part's module does not have, or one it has that the
checkpoint lacks, fails the load naming it.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

import torch
from torch import nn

from encoder_pod.models.weights import CheckpointError, ReadReport, SafetensorsIndex, check_names

log = logging.getLogger(__name__)

PartModule = nn.Module | nn.Parameter
"""What a part is loaded into: a module (tower, projector) or a lone parameter (LLaVA's image_newline)."""


@dataclass(frozen=True)
class KeyPlan:
    """Checkpoint keys per wanted part, each with the name it has inside that part."""

    parts: Mapping[str, Mapping[str, str]]
    """Part path -> {checkpoint key: key inside the part's module}."""

    def keys(self) -> list[str]:
        """Every checkpoint key to read."""
        return sorted(key for part in self.parts.values() for key in part)


def empty_model(factory: Callable[[], Any]) -> Any:
    """``factory()`` with weight initialisation switched off (the weights are read right after)."""
    from transformers.initialization import no_init_weights

    with no_init_weights():
        return factory()


def meta_model(full_cls: type, config: Any) -> nn.Module:
    """The whole model on the meta device: its module tree and key rules, no memory, no weights."""
    with torch.device("meta"):
        return empty_model(lambda: full_cls(copy.deepcopy(config)))


def plan_keys(
    full_cls: type,
    config: Any,
    checkpoint_keys: Sequence[str],
    part_paths: Sequence[str],
    meta: nn.Module | None = None,
) -> KeyPlan:
    """Which checkpoint keys belong to which of ``part_paths``, by transformers' own key mapping."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    meta = meta if meta is not None else meta_model(full_cls, config)
    rules = get_model_conversion_mapping(meta)
    renamings = [rule for rule in rules if isinstance(rule, WeightRenaming)]
    converters = [rule for rule in rules if isinstance(rule, WeightConverter)]
    meta_keys = meta.state_dict()
    parts: dict[str, dict[str, str]] = {path: {} for path in part_paths}
    for key in checkpoint_keys:
        mapped, converter = rename_source_key(key, renamings, converters, meta.base_model_prefix, meta_keys)
        if mapped not in meta_keys and key in meta_keys:
            mapped, converter = key, None  # already the module path (a checkpoint saved in memory layout)
        part = _part_of(mapped, part_paths)
        if part is None:
            continue
        if converter is not None:
            raise CheckpointError(
                f"{key} maps to {mapped} through a weight conversion ({converter}) that this pod does not apply"
            )
        parts[part][key] = mapped[len(part) + 1 :] if mapped != part else ""
    empty = [path for path, keys in parts.items() if not keys]
    if empty:
        raise CheckpointError(f"the checkpoint holds no tensor of {empty} (is it a {full_cls.__name__} checkpoint?)")
    return KeyPlan(parts)


def _part_of(key: str, part_paths: Sequence[str]) -> str | None:
    for path in part_paths:
        if key == path or key.startswith(path + "."):
            return path
    return None


class FullCheckpoint:
    """A whole ``full_cls`` checkpoint directory, from which chosen parts are read and loaded."""

    def __init__(self, model_dir: Path, full_cls: type[Any], config: Any | None = None) -> None:
        self.model_dir = Path(model_dir)
        self.full_cls = full_cls
        self.config = config if config is not None else full_cls.config_class.from_pretrained(self.model_dir)
        self.index = SafetensorsIndex(self.model_dir)
        self._meta: nn.Module | None = None

    @property
    def meta(self) -> nn.Module:
        """The whole model on the meta device (built once)."""
        if self._meta is None:
            self._meta = meta_model(self.full_cls, self.config)
        return self._meta

    def plan(self, part_paths: Sequence[str]) -> KeyPlan:
        """The checkpoint keys of ``part_paths``."""
        return plan_keys(self.full_cls, self.config, list(self.index.weight_map), part_paths, meta=self.meta)

    def build_like(self, path: str, dtype: torch.dtype) -> Any:
        """A real, empty copy of the full model's part at ``path``, built the way the full model builds it.

        A sub-model (``PreTrainedModel``: the vision and audio towers) is ``cls._from_config(sub_config,
        dtype=...)`` as the full model's ``__init__`` makes it, so computed buffers (rotary
        frequencies) are the full model's; any other module (a projector) is ``cls(config)``, as
        the families construct theirs; a lone parameter (``image_newline``) an empty one.
        """
        from transformers import PreTrainedModel

        parent, _, leaf = path.rpartition(".")
        lone = dict(self.meta.get_submodule(parent).named_parameters(recurse=False)).get(leaf)
        if lone is not None:
            return new_parameter(lone.shape, dtype)
        template = self.meta.get_submodule(path)
        cls: Any = type(template)
        if isinstance(template, PreTrainedModel):
            config = copy.deepcopy(template.config)
            return empty_model(lambda: cls._from_config(config, dtype=dtype)).eval()
        config = copy.deepcopy(self.config)
        return empty_model(lambda: cls(config)).to(dtype).eval()

    def load(self, parts: Mapping[str, PartModule]) -> ReadReport:
        """Read only the tensors of ``parts`` (module path -> built module), strictly, into the modules themselves.

        Every part's tensor names are checked against the checkpoint before a byte is read.
        """
        plan = self.plan(list(parts))
        targets: dict[str, torch.Tensor] = {}
        for path, module in parts.items():
            own = {"": module} if isinstance(module, nn.Parameter) else module.state_dict(keep_vars=True)
            check_names(own, plan.parts[path].values(), f"{path} ({type(module).__name__})")
            targets.update({key: own[local] for key, local in plan.parts[path].items()})
        report = self.index.read_into(targets)
        log.info(
            "read %d tensors (%d bytes) from %d of %d shards of %s",
            report.tensors,
            report.bytes_read,
            len(report.shards_opened),
            report.shards_total,
            self.model_dir,
        )
        return report


def new_parameter(shape: Sequence[int], dtype: torch.dtype) -> nn.Parameter:
    """An uninitialised frozen parameter, filled by :meth:`FullCheckpoint.load`."""
    return nn.Parameter(torch.empty(tuple(shape), dtype=dtype), requires_grad=False)


def parameter_count(*modules: PartModule) -> int:
    """Parameters of the loaded parts (what /server_info calls the tower's size)."""
    total = 0
    for module in modules:
        total += module.numel() if isinstance(module, nn.Parameter) else sum(p.numel() for p in module.parameters())
    return total


class Host(nn.Module):
    """Carries the loaded parts under the attribute names a family's ``XModel`` gives them.

    A family's own ``XModel.get_image_features`` (with its decorators) then runs on it unchanged:
    the rows are what the full model computes, by the same code, with no language model built.
    """

    def __init__(self, config: Any, **parts: PartModule) -> None:
        super().__init__()
        self.config = config
        for name, part in parts.items():
            setattr(self, name, part)

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the parts (some families cast pixels to it)."""
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        """Device of the parts."""
        return next(self.parameters()).device


def host_class(name: str, **methods: Callable[..., Any]) -> type[Host]:
    """A :class:`Host` subclass carrying the family's (unbound) ``XModel`` methods."""
    return type(name, (Host,), dict(methods))


class FullLayout:
    """Mixin of the adapters that serve a whole checkpoint: its class and the parts read out of it."""

    full_classes: ClassVar[Mapping[str, type]]
    """Architecture config.json names -> the class; the first is used when it names none."""
    model_dir: Path
    checkpoint: Any

    @classmethod
    def full_class(cls, checkpoint: Any) -> type:
        """The ``...ForConditionalGeneration`` class of ``checkpoint``."""
        default = next(iter(cls.full_classes.values()))
        return cls.full_classes.get(checkpoint.architecture or "", default)

    @classmethod
    def part_paths(cls, checkpoint: Any) -> tuple[str, ...]:
        """Module paths (in the full model) of what is read: tower, projector ..."""
        raise NotImplementedError

    @classmethod
    def weight_keys(cls, checkpoint: Any, keys: Sequence[str]) -> list[str]:
        """The checkpoint keys this adapter reads (what a download limited to the encoder fetches)."""
        full: Any = cls.full_class(checkpoint)
        config = full.config_class.from_pretrained(checkpoint.path)
        return plan_keys(full, config, keys, cls.part_paths(checkpoint)).keys()

    def open_checkpoint(self) -> FullCheckpoint:
        """This adapter's checkpoint, ready for :meth:`FullCheckpoint.load`."""
        return FullCheckpoint(self.model_dir, self.full_class(self.checkpoint))
