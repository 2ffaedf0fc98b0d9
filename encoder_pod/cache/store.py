"""A byte-budgeted LRU of item outputs, bound to one model namespace.

Used from one event loop only (the runtime's), so no locks. Every entry is counted at its rows'
storage plus a fixed overhead (:data:`~encoder_pod.cache.entries.ENTRY_OVERHEAD_BYTES`); an
entry larger than the whole budget is not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from encoder_pod.cache.entries import CachedItem


@dataclass
class StoreStats:
    """Counters since start."""

    evictions: int = 0
    refused: int = 0
    """Entries larger than the whole budget, never kept."""


class EmbeddingStore:
    """Least recently used entries go first once ``budget_bytes`` would be exceeded."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.bytes = 0
        self.namespace: bytes | None = None
        self.stats = StoreStats()
        self._entries: OrderedDict[bytes, CachedItem] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def bind(self, namespace: bytes) -> None:
        """Serve keys of the model ``namespace``; a different model than before empties the store."""
        if namespace != self.namespace:
            self.clear()
            self.namespace = namespace

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()
        self.bytes = 0

    def get(self, key: bytes) -> CachedItem | None:
        """The entry (now the most recently used), or None."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: bytes, entry: CachedItem) -> bool:
        """Keep ``entry`` under ``key``, evicting the least recently used as needed; False if too large."""
        size = entry.nbytes
        if size > self.budget_bytes:
            self.stats.refused += 1
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
        while self._entries and self.bytes + size > self.budget_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= evicted.nbytes
            self.stats.evictions += 1
        self._entries[key] = entry
        self.bytes += size
        return True
