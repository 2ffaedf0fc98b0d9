"""The byte-budgeted LRU: what is kept, what goes first, what a model change does."""

from __future__ import annotations

import pytest
import torch

from encoder_pod.cache.entries import ENTRY_OVERHEAD_BYTES, CachedItem
from encoder_pod.cache.store import EmbeddingStore

pytestmark = pytest.mark.unit

ROW_BYTES = 256 * 4  # one float32 row of width 256


def item(rows: int, fill: float = 0.0) -> CachedItem:
    return CachedItem(torch.full((rows, 256), float(fill)), rows, (1, rows, 1))


def size(rows: int) -> int:
    return rows * ROW_BYTES + ENTRY_OVERHEAD_BYTES


def test_least_recently_used_goes_first_and_bytes_stay_within_budget():
    store = EmbeddingStore(budget_bytes=3 * size(10))
    for n in range(3):
        assert store.put(bytes([n]), item(10, n))
    assert store.get(bytes([0])) is not None  # 0 is now the most recently used; 1 the least
    store.put(bytes([3]), item(10))
    assert store.get(bytes([1])) is None
    assert all(store.get(bytes([n])) is not None for n in (0, 2, 3))
    assert store.bytes == 3 * size(10) and store.stats.evictions == 1
    store.put(bytes([4]), item(15))  # needs room for 1.5 entries: evicts the two least recently used
    assert store.get(bytes([3])) is not None and store.get(bytes([4])) is not None
    assert store.bytes == size(10) + size(15) <= store.budget_bytes and store.stats.evictions == 3 and len(store) == 2


def test_an_entry_larger_than_the_budget_is_not_kept_and_evicts_nothing():
    store = EmbeddingStore(budget_bytes=size(10))
    store.put(b"a", item(10))
    assert not store.put(b"big", item(11))
    assert store.get(b"a") is not None and store.stats.refused == 1 and store.stats.evictions == 0


def test_putting_a_key_again_replaces_it_without_double_counting():
    store = EmbeddingStore(budget_bytes=10 * size(10))
    store.put(b"k", item(10))
    store.put(b"k", item(4))
    assert len(store) == 1 and store.bytes == size(4)


def test_a_different_model_empties_the_store_the_same_model_keeps_it():
    store = EmbeddingStore(budget_bytes=10 * size(10))
    store.bind(b"model-a")
    store.put(b"k", item(10))
    store.bind(b"model-a")
    assert store.get(b"k") is not None
    store.bind(b"model-b")
    assert store.get(b"k") is None and store.bytes == 0 and len(store) == 0


def test_an_entry_is_counted_at_its_own_storage_not_a_view_of_a_larger_one():
    batch = torch.zeros(100, 256)
    view = CachedItem(batch[:10], 10, ())
    assert view.nbytes == 100 * ROW_BYTES + ENTRY_OVERHEAD_BYTES  # why split_part clones its rows
