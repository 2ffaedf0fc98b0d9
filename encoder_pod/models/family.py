"""Model families: which checkpoints a family serves (discovery) and its test checkpoints.

A family (``qwen2_vl``, ``clip``, ``whisper`` ...) is what a user names with ``make-tiny-model
--arch`` and what discovery finds in a checkpoint directory. It is described by plain data, one
:class:`LayoutRule` per way its checkpoints are laid out on disk (the encoder tower saved on its
own, or a whole multimodal checkpoint the tower and projector are read out of), so discovery
reads ``config.json`` and nothing else: no torch, no transformers at import. The heavy half, the
serving adapter classes and the tiny-checkpoint writer, is a :class:`FamilyCode` loaded on first
use, so one family's optional pieces never block another.

Discovery returns a :class:`Checkpoint`: the family, the layout found, the class config.json
names, the config itself. The adapter is built from it, so a family that recognises several
layouts loads each its own way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

# What discovery finds lives in its own module, which the adapters' base imports too (a
# family -> base -> family cycle otherwise); re-exported here, where the families use it.
from encoder_pod.models.checkpoint import Checkpoint, Layout, read_config

if TYPE_CHECKING:  # the adapter classes import torch; discovery must not
    from encoder_pod.models.base import BaseAdapter

__all__ = ("Checkpoint", "FamilyCode", "FamilyRegistry", "Layout", "LayoutRule", "ModelFamily", "read_config")


@dataclass(frozen=True)
class LayoutRule:
    """One layout of a family, as its config.json says it: a model_type and the classes it may name.

    Both must agree: a tower saved by ``save_pretrained`` always has ``model_type``; a config that
    names classes must name one of ``architectures`` (a full vision-language checkpoint of the
    same family has another model_type and is another rule, never a tower by accident).
    """

    layout: Layout
    model_type: str
    architectures: tuple[str, ...]
    """Classes config.json may name; a config that names none is accepted on its model_type."""

    def architecture(self, config: Mapping[str, Any]) -> tuple[bool, str | None]:
        """(matches, the accepted class config.json names or None when it names none)."""
        if config.get("model_type") != self.model_type:
            return False, None
        named = config.get("architectures") or []
        if not named:
            return True, None
        accepted = next((name for name in named if name in self.architectures), None)
        return accepted is not None, accepted


@dataclass(frozen=True)
class FamilyCode:
    """The heavy half of a family (imports torch and transformers), loaded on first use."""

    adapters: Mapping[Layout, type[BaseAdapter]]
    """The serving adapter class for each layout the family recognises."""
    write_tiny: Callable[[Path, str, Layout], None]
    """``write_tiny(out, preset, layout)``: a random-weight checkpoint (offline), config.json last."""


class ModelFamily:
    """One model family: its layouts (discovery), its test checkpoints, its adapter classes."""

    def __init__(
        self,
        name: str,
        layouts: Iterable[LayoutRule],
        code: Callable[[], FamilyCode],
        *,
        tiny_layouts: Iterable[Layout] | None = None,
        hub_ids: Iterable[str] = (),
    ) -> None:
        """``code`` imports and returns the family's :class:`FamilyCode` (called on first use)."""
        self.name = name
        self.layouts = tuple(layouts)
        self.tiny_layouts = tuple(tiny_layouts) if tiny_layouts is not None else (self.layouts[0].layout,)
        """Layouts ``write_tiny`` can write; the first is the default."""
        self.hub_ids = tuple(hub_ids)
        """Known hub checkpoints of this family (documentation and fetch tests)."""
        self._code = code

    def __repr__(self) -> str:
        return f"ModelFamily({self.name!r}, layouts={[r.layout.value for r in self.layouts]})"

    def recognise(self, path: Path, config: Mapping[str, Any]) -> Checkpoint | None:
        """The :class:`Checkpoint` when ``config`` (the config.json at ``path``) is one of ours."""
        for rule in self.layouts:
            matches, architecture = rule.architecture(config)
            if matches:
                return Checkpoint(Path(path), self.name, rule.layout, rule.model_type, architecture, config)
        return None

    def adapter_class(self, checkpoint: Checkpoint) -> type[BaseAdapter]:
        """The adapter class that serves ``checkpoint`` (imports the family's code)."""
        adapters = self._code().adapters
        if checkpoint.family != self.name or checkpoint.layout not in adapters:
            raise ValueError(f"family {self.name} does not serve a {checkpoint.layout.value} checkpoint of {checkpoint.family}")
        return adapters[checkpoint.layout]

    def write_tiny(self, out: Path, preset: str = "tiny", layout: Layout | None = None) -> Path:
        """Write a random-weight checkpoint of ``layout`` (default: the first tiny layout) to ``out``."""
        chosen = layout or self.tiny_layouts[0]
        if chosen not in self.tiny_layouts:
            known = ", ".join(item.value for item in self.tiny_layouts)
            raise ValueError(f"{self.name} has no tiny {chosen.value} checkpoint; known: {known}")
        self._code().write_tiny(Path(out), preset, chosen)
        return Path(out)


class FamilyRegistry:
    """The families a pod knows; discovery asks each whether a checkpoint is theirs."""

    def __init__(self, families: Iterable[ModelFamily]) -> None:
        self._families: dict[str, ModelFamily] = {}
        for family in families:
            if family.name in self._families:
                raise ValueError(f"two families are named {family.name!r}")
            self._families[family.name] = family

    def __iter__(self) -> Iterator[ModelFamily]:
        return iter(self._families.values())

    def names(self) -> list[str]:
        """Every family's name, sorted."""
        return sorted(self._families)

    def get(self, name: str) -> ModelFamily:
        """The family named ``name``; ValueError lists the known ones."""
        try:
            return self._families[name]
        except KeyError:
            raise ValueError(f"unknown arch {name!r}; known: {', '.join(self.names())}") from None

    def recognise_all(self, path: Path, config: Mapping[str, Any]) -> list[Checkpoint]:
        """What every family that claims this config found (discovery wants exactly one)."""
        found = (family.recognise(path, config) for family in self)
        return [checkpoint for checkpoint in found if checkpoint is not None]

    def discover(self, path: Path) -> Checkpoint:
        """The one family's :class:`Checkpoint` for the directory ``path``; ValueError otherwise."""
        config = read_config(path)
        found = self.recognise_all(path, config)
        if len(found) != 1:
            kind = config.get("architectures") or config.get("model_type")
            raise ValueError(
                f"{'no' if not found else 'more than one'} encoder adapter for checkpoint {str(path)!r} "
                f"(architectures/model_type {kind!r}); supported: {', '.join(self.names())}"
            )
        return found[0]
