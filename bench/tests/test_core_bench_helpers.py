"""core_bench's pure summaries: the lockstep overhead is paired step by step, sessions merged in order."""

from __future__ import annotations

import pytest

from bench.paired import summarize_lockstep

pytestmark = pytest.mark.unit


def test_lockstep_overhead_pairs_each_step_with_the_ceilings_own_step() -> None:
    # The machine slows down in the last step of each session: 10 ms more for every side. Paired
    # per step that drift cancels; p50 of one side minus p50 of the other would not see it as such.
    sessions = [
        {"ceiling": [40.0, 40.0, 50.0], "server-binary": [43.0, 44.0, 53.0], "server-push": [42.0, 41.0, 52.0]},
        {"ceiling": [41.0, 41.0, 51.0], "server-binary": [44.0, 45.0, 54.0], "server-push": [43.0, 42.0, 53.0]},
    ]
    out = summarize_lockstep(sessions)
    assert out["steps"] == 6
    assert out["server-binary_overhead_ms"]["median"] == 3.0  # diffs 3, 4, 3, 3, 4, 3
    assert out["server-push_overhead_ms"]["median"] == 2.0  # diffs 2, 1, 2, 2, 1, 2
    assert out["server-binary_overhead_ms"]["q1"] == 3.0 and out["server-binary_overhead_ms"]["q3"] == 4.0
    assert out["p50_ms"]["ceiling"] == 41.0 and out["p50_ms"]["server-binary"] == 44.5
    assert "ceiling_overhead_ms" not in out


def test_lockstep_refuses_to_pair_sides_of_unequal_length() -> None:
    with pytest.raises(ValueError, match="server-binary"):
        summarize_lockstep([{"ceiling": [40.0, 41.0], "server-binary": [43.0]}])
