"""tower_memory's pure helpers: the enlarged language model's config, the per-round ratio."""

from __future__ import annotations

import pytest

from bench.tower_memory import enlarge, summarize

pytestmark = pytest.mark.unit

TEXT = {"hidden_size": 768, "num_hidden_layers": 12, "head_dim": 64, "vocab_size": 32000}


def test_enlarge_sets_the_language_model_and_the_projector_width_it_feeds() -> None:
    config = {"projection_dim": 64, "vision_config": {"hidden_size": 64, "projection_dim": 64},
              "text_config": {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 4096, "rope_theta": 1e4}}
    out = enlarge(config, TEXT)
    assert out["text_config"] == {"hidden_size": 768, "num_hidden_layers": 12, "vocab_size": 32000, "head_dim": 64,
                                  "rope_theta": 1e4}
    assert out["projection_dim"] == 768 and out["vision_config"] == {"hidden_size": 64, "projection_dim": 768}
    assert config["text_config"]["hidden_size"] == 64  # the input is left as it was


def test_enlarge_leaves_the_tower_alone_where_no_top_level_projection_width_is_named() -> None:
    config = {"vision_config": {"hidden_size": 32, "projection_dim": 16}, "text_config": {"hidden_size": 48}}
    out = enlarge(config, TEXT)
    assert out["vision_config"] == {"hidden_size": 32, "projection_dim": 16}
    assert out["text_config"] == {"hidden_size": 768, "head_dim": 64}


def _side(peak: int, rows: list[int] | None = None) -> dict[str, object]:
    return {"rss_before": 100, "load_growth": peak // 2, "peak_growth": peak, "anon_growth": peak // 2, "file_growth": 0,
            "address_space_growth": peak, "rows": rows or [16, 768], "parameters": peak}


def test_ratio_is_the_median_of_each_rounds_own_ratio() -> None:
    # The machine's baseline drifts between rounds; each round's pair shares it.
    rounds = [{"pod": _side(10), "whole": _side(100)}, {"pod": _side(30), "whole": _side(150)},
              {"pod": _side(20), "whole": _side(400)}]
    out = summarize(rounds)
    assert out["ratio_peak"] == pytest.approx(0.1)  # per round 0.1, 0.2, 0.05
    assert out["pod"]["peak_growth"] == 20 and out["whole"]["peak_growth"] == 150
    assert out["rows"] == [16, 768]


def test_sides_that_returned_different_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="rows"):
        summarize([{"pod": _side(10, [16, 768]), "whole": _side(100, [17, 768])}])
