"""What the cache holds per item, and how a request's part is cut into items and put back together.

An :class:`~encoder_pod.models.base.EncodedPart` is one request's rows, in item order, with one
token count and one grid per item and the request's ``extras``. Extras follow the adapters'
contract: a list value holds one entry per item (``second_per_grid_ts``, ``video_timestamps``);
any other value is a fact of the whole request, the same for every item of this model. Cutting
a part into :class:`CachedItem` s and joining them again gives back the same part, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from encoder_pod.models.base import EncodedPart

ENTRY_OVERHEAD_BYTES = 512
"""Python objects around an entry's rows (its key, grid, extras, the tensor object), counted
against the budget so a cache of many tiny items stays within it too."""


@dataclass(frozen=True, eq=False)
class CachedItem:
    """One item's output: its rows (owning their own storage), token count, grid and extras."""

    rows: torch.Tensor
    tokens: int
    grid: tuple[int, ...]
    per_item: dict[str, Any] = field(default_factory=dict)
    """This item's entry of each per-item extras list."""
    shared: dict[str, Any] = field(default_factory=dict)
    """Extras that are facts of the whole request (not lists)."""

    @property
    def nbytes(self) -> int:
        """What this entry costs the budget."""
        return self.rows.untyped_storage().nbytes() + ENTRY_OVERHEAD_BYTES


def split_part(part: EncodedPart) -> list[CachedItem]:
    """One :class:`CachedItem` per item of ``part``; rows are copied so no entry pins the batch output."""
    count = len(part.item_tokens)
    extras = getattr(part, "extras", None) or {}
    per_item = {k: v for k, v in extras.items() if isinstance(v, list) and len(v) == count}
    shared = {k: v for k, v in extras.items() if k not in per_item}
    grids = part.item_grids or [[] for _ in range(count)]
    items: list[CachedItem] = []
    start = 0
    for index, (tokens, grid) in enumerate(zip(part.item_tokens, grids)):
        rows = part.embedding[start : start + tokens].clone()
        start += tokens
        items.append(CachedItem(rows, int(tokens), tuple(grid), {k: v[index] for k, v in per_item.items()}, shared))
    return items


def join_items(items: Sequence[CachedItem]) -> EncodedPart:
    """The request's part from its items in order (the inverse of :func:`split_part`)."""
    rows = items[0].rows if len(items) == 1 else torch.cat([item.rows for item in items])
    part = EncodedPart(rows, [item.tokens for item in items], [list(item.grid) for item in items])
    extras: dict[str, Any] = dict(items[0].shared)
    for name in items[0].per_item:
        extras[name] = [item.per_item.get(name) for item in items]
    if extras:
        part.extras = extras  # type: ignore[attr-defined,unused-ignore]
    return part
