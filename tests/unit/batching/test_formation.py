"""Batch formation (take_batch): budget, modality groups, oldest first, oversized and video alone."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from encoder_pod.batching.formation import BatchLimits, take_batch
from encoder_pod.modality import Modality
from encoder_pod.settings import load_settings

pytestmark = pytest.mark.unit

I, A, V = Modality.IMAGE, Modality.AUDIO, Modality.VIDEO


@dataclass(frozen=True)
class Waiting:
    name: str
    modality: Modality
    tokens: int


def _queue(*specs: tuple[str, Modality, int]) -> list[Waiting]:
    return [Waiting(*spec) for spec in specs]


def _names(entries: list[Waiting]) -> list[str]:
    return [e.name for e in entries]


CASES = [
    # (id, waiting oldest first, limits (size, tokens), batch, still waiting)
    ("empty", [], (8, 100), [], []),
    ("fills within the budget", [("a", I, 40), ("b", I, 40), ("c", I, 40)], (8, 100), ["a", "b"], ["c"]),
    ("budget exactly met", [("a", I, 50), ("b", I, 50)], (8, 100), ["a", "b"], []),
    ("a later smaller request still joins", [("a", I, 60), ("b", I, 50), ("c", I, 40)], (8, 100), ["a", "c"], ["b"]),
    ("max batch size", [(f"r{i}", I, 1) for i in range(5)], (3, 100), ["r0", "r1", "r2"], ["r3", "r4"]),
    ("modalities never mix", [("a", I, 10), ("x", A, 10), ("b", I, 10)], (8, 100), ["a", "b"], ["x"]),
    ("the oldest decides the modality", [("x", A, 10), ("a", I, 10), ("y", A, 10)], (8, 100), ["x", "y"], ["a"]),
    ("oversized runs alone", [("big", I, 500), ("a", I, 1)], (8, 100), ["big"], ["a"]),
    ("oversized waits its turn, never skipped", [("a", I, 90), ("big", I, 500), ("b", I, 20)], (8, 100), ["a"], ["big", "b"]),
    ("video alone", [("v", V, 5), ("w", V, 5), ("a", I, 5)], (8, 100), ["v"], ["w", "a"]),
    ("video never joins an image batch", [("a", I, 5), ("v", V, 5), ("b", I, 5)], (8, 100), ["a", "b"], ["v"]),
]


@pytest.mark.parametrize("waiting, limits, batch, rest", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_take_batch(waiting, limits, batch, rest):
    got, left = take_batch(_queue(*waiting), BatchLimits(*limits))
    assert (_names(got), _names(left)) == (batch, rest)


def test_a_started_batch_is_extended_by_the_same_rules_and_never_reordered():
    started = _queue(("a", I, 60), ("b", I, 20))
    late = _queue(("x", A, 1), ("c", I, 30), ("d", I, 20), ("e", I, 1))
    got, left = take_batch(late, BatchLimits(4, 100), started)
    assert _names(got) == ["a", "b", "d"] and _names(left) == ["x", "c", "e"]  # e would pass 100
    video = _queue(("v", V, 1))
    assert _names(take_batch(_queue(("w", V, 1)), BatchLimits(8, 100), video)[0]) == ["v"]


def test_every_request_is_in_exactly_one_list_in_arrival_order():
    waiting = _queue(*[(f"r{i}", (I, A, V)[i % 3], (i * 37) % 120) for i in range(30)])
    got, left = take_batch(waiting, BatchLimits(6, 150))
    assert sorted(_names(got) + _names(left)) == sorted(_names(waiting))
    order = _names(waiting)
    assert [order.index(n) for n in _names(left)] == sorted(order.index(n) for n in _names(left))
    assert got[0] is waiting[0]


def test_limits_come_from_the_settings():
    settings = load_settings(env={"ENCODER_MAX_BATCH_SIZE": "3", "ENCODER_MAX_BATCH_TOKENS": "77"})
    assert BatchLimits.of(settings.batching) == BatchLimits(3, 77)
