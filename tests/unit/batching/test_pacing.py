"""When the next batch is formed (formation_due) and what the stages are expected to take (ServiceEstimate)."""

from __future__ import annotations

import math

import pytest

from encoder_pod.batching.pacing import HANDOFF_S, PREPROCESS_SLACK, Pacing, ServiceEstimate, formation_due

pytestmark = pytest.mark.unit


def _due(free_at: float, pre: float = 0.0, oldest: float = 0.0, max_wait: float = 0.0, full: bool = False) -> float:
    return formation_due(model_free_at=free_at, preprocess_s=pre, oldest_submitted=oldest, max_wait_s=max_wait, full=full)


def test_an_idle_model_takes_the_batch_at_once():
    assert _due(-math.inf, pre=0.5) == -math.inf


def test_a_forward_of_unknown_length_is_waited_for():
    assert _due(math.inf, pre=0.5) == math.inf


def test_the_batch_forms_one_preprocessing_before_the_model_is_free():
    due = _due(10.0, pre=0.2)
    assert due == pytest.approx(10.0 - 0.2 * (1 + PREPROCESS_SLACK) - HANDOFF_S)
    assert 9.7 < due < 9.8
    # A longer preprocessing starts earlier; one longer than the forward is due before it began.
    assert _due(10.0, pre=0.4) < due
    assert _due(10.0, pre=20.0) < 0


def test_max_wait_only_ever_delays_a_batch_that_is_not_full():
    assert _due(-math.inf, oldest=5.0, max_wait=0.05) == pytest.approx(5.05)
    assert _due(-math.inf, oldest=5.0, max_wait=0.05, full=True) == -math.inf
    assert _due(10.0, pre=0.2, oldest=5.0, max_wait=0.05) == _due(10.0, pre=0.2)  # the model is later anyway


def test_estimate_before_any_batch_is_zero_and_unknown():
    est = ServiceEstimate()
    assert not est.known and est.predict(100) == 0.0
    assert Pacing().forward_end(3.0, 100) == math.inf


def test_estimate_fits_a_fixed_cost_plus_a_cost_per_row():
    est = ServiceEstimate()
    for tokens in (100, 200, 400, 800) * 3:
        est.observe(tokens, 0.010 + 0.0001 * tokens)
    assert est.known
    assert est.predict(300) == pytest.approx(0.040, rel=1e-6)
    assert est.predict(1600) == pytest.approx(0.170, rel=1e-6)
    pacing = Pacing(forward=est)
    assert pacing.forward_end(5.0, 300) == pytest.approx(5.040)


def test_estimate_of_one_batch_size_scales_with_rows():
    est = ServiceEstimate()
    for _ in range(5):
        est.observe(196, 0.05)
    assert est.predict(196) == pytest.approx(0.05)
    assert est.predict(392) == pytest.approx(0.10)


def test_estimate_follows_the_recent_past():
    est = ServiceEstimate(decay=0.5)
    for _ in range(20):
        est.observe(100, 1.0)
    for _ in range(20):
        est.observe(100, 0.1)  # the machine got faster (or a noisy neighbour left)
    assert est.predict(100) == pytest.approx(0.1, rel=1e-3)


def test_estimate_never_predicts_less_for_more_rows_or_below_zero():
    est = ServiceEstimate()
    for tokens, seconds in ((100, 0.3), (200, 0.2), (300, 0.1)):
        est.observe(tokens, seconds)
    assert est.predict(1000) == est.predict(100) and 0.1 < est.predict(1000) < 0.3  # no trend: the (weighted) mean
    est = ServiceEstimate()
    for tokens, seconds in ((100, 0.0), (1000, 1.0), (100, 0.0), (1000, 1.0)):
        est.observe(tokens, seconds)
    assert est.predict(1) == 0.0
