"""The dashboard pictures: every panel of the dashboard JSON is drawn, each with the series its queries returned.

The query functions here return fixed matrices (the shape of Prometheus's query API answers);
the real Prometheus run that draws the committed pictures is
tests/integration/test_dashboard_prometheus.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from monitoring import dashboard, pictures

pytestmark = pytest.mark.unit

END = 1_800_000_000.0


def _matrix(expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    if "encoder_audio_seconds_total" in expr:
        return []  # a panel without data
    if "encoder_batch_size_bucket" in expr:
        return [{"metric": {"le": le}, "values": [[start, str(n)], [end, str(n + 1)]]}
                for le, n in (("1.0", 2), ("2.0", 5), ("+Inf", 5))]
    return [{"metric": {"pool": "vision", "pod": "vision-0", "code": "429", "modality": "IMAGE"},
             "values": [[start, "1"], [end, "NaN"], [end + step, "2"]]}]


def _vector(expr: str, at: float) -> list[dict[str, Any]]:
    return [{"metric": {"pool": "vision", "code": "504", "kind": "timeout"}, "value": [at, "4"]}]


def test_every_panel_is_drawn_with_what_its_queries_returned(tmp_path: Path) -> None:
    drawn = pictures.draw_all(tmp_path, _matrix, _vector, END - 600, END, 10, "1m", "10m")
    model = json.loads(dashboard.OUTPUT.read_text())
    targets = {p["title"]: len(p["targets"]) for p in model["panels"] if p["type"] != "row"}
    shown = {p.title: p.series for panels in drawn.values() for p in panels}
    assert set(shown) == set(targets)  # every panel is in one picture
    assert shown["Audio seconds per second"] == 0
    assert shown["Batch size distribution"] == 3
    assert shown["Errors by code and kind"] == 1
    assert shown["p99 latency by stage"] == targets["p99 latency by stage"]
    for name in pictures.PICTURES:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_legends_fill_grafana_templates() -> None:
    assert pictures.legend("{{pod}} rank {{rank}}", {"pod": "p-0", "rank": "1"}) == "p-0 rank 1"
    assert pictures.legend("", {"le": "2.0"}) == '{"le": "2.0"}'
