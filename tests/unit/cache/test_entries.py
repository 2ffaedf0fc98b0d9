"""A part cut into cached items and joined again is the same part, bit for bit."""

from __future__ import annotations

import pytest
import torch

from encoder_pod.cache.entries import join_items, split_part
from encoder_pod.models.base import EncodedPart

pytestmark = pytest.mark.unit


def _part(tokens: list[int], dtype: torch.dtype = torch.bfloat16) -> EncodedPart:
    rows = torch.randn(sum(tokens), 8).to(dtype)
    return EncodedPart(rows, tokens, [[1, t, 1] for t in tokens])


def test_split_then_join_is_the_identity_and_items_own_their_rows():
    part = _part([3, 1, 4])
    items = split_part(part)
    assert [i.tokens for i in items] == [3, 1, 4] and [i.grid for i in items] == [(1, 3, 1), (1, 1, 1), (1, 4, 1)]
    for item in items:
        assert item.rows.untyped_storage().data_ptr() != part.embedding.untyped_storage().data_ptr()
        assert item.rows.untyped_storage().nbytes() == item.rows.numel() * item.rows.element_size()
    joined = join_items(items)
    assert joined.embedding.dtype == torch.bfloat16
    assert torch.equal(joined.embedding.view(torch.int16), part.embedding.view(torch.int16))
    assert joined.item_tokens == part.item_tokens and joined.item_grids == part.item_grids


def test_items_recombine_in_any_order():
    a, b = split_part(_part([2])), split_part(_part([5]))
    joined = join_items([b[0], a[0], b[0]])
    assert torch.equal(joined.embedding, torch.cat([b[0].rows, a[0].rows, b[0].rows]))
    assert joined.item_tokens == [5, 2, 5]


def test_per_item_extras_follow_their_items_and_request_facts_stay():
    part = _part([2, 3])
    part.extras = {"second_per_grid_ts": [0.5, 1.0], "video_timestamps": [[0.0, 0.5], [0.0]], "layout": "rows"}  # type: ignore[attr-defined,unused-ignore]
    first, second = split_part(part)
    assert first.per_item == {"second_per_grid_ts": 0.5, "video_timestamps": [0.0, 0.5]}
    joined = join_items([second, first])
    assert joined.extras == {  # type: ignore[attr-defined,unused-ignore]
        "layout": "rows", "second_per_grid_ts": [1.0, 0.5], "video_timestamps": [[0.0], [0.0, 0.5]]
    }
