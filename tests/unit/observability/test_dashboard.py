"""The Grafana dashboard: the committed JSON is the generator's output, and it has what it promises."""

from __future__ import annotations

import json

import pytest

from monitoring import dashboard
from monitoring.panels import ROWS
from monitoring.promql import instantiate, metric_names, panel_queries

pytestmark = pytest.mark.unit


def test_the_committed_dashboard_is_what_the_generator_makes(capsys: pytest.CaptureFixture[str]) -> None:
    assert dashboard.main(["--check"]) == 0, capsys.readouterr().err


def test_check_fails_on_a_stale_file(tmp_path) -> None:
    stale = tmp_path / "encoderpool.json"
    stale.write_text(dashboard.render().replace("Items per second by modality", "Images per second"))
    assert dashboard.main(["--check", "--out", str(stale)]) == 1
    assert dashboard.main(["--out", str(stale)]) == 0 and dashboard.main(["--check", "--out", str(stale)]) == 0


def test_pool_and_pod_variables_and_unique_panel_ids() -> None:
    model = json.loads(dashboard.OUTPUT.read_text())
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert set(variables) == {"datasource", "pool", "pod"}
    assert variables["pool"]["query"] == "label_values(encoder_max_queue, pool)"
    assert variables["pool"]["includeAll"] and variables["pool"]["multi"]
    assert "$pool" in variables["pod"]["query"]
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids)) and 0 not in ids
    for panel in model["panels"]:
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24


def test_every_panel_the_issue_asks_for_is_there_with_its_series() -> None:
    wanted = {
        "Items per second by modality": {"encoder_items_total"},
        "Audio seconds per second": {"encoder_audio_seconds_total"},
        "p50 latency by stage": {"encoder_queue_wait_seconds_bucket", "encoder_decode_seconds_bucket",
                                 "encoder_preprocess_seconds_bucket", "encoder_forward_seconds_bucket",
                                 "encoder_delivery_seconds_bucket", "encoder_request_seconds_bucket"},
        "p99 latency by stage": {"encoder_forward_seconds_bucket"},
        "Batch size distribution": {"encoder_batch_size_bucket"},
        "Queue depth and in flight against MAX_QUEUE": {"encoder_queue_depth", "encoder_max_queue"},
        "Refusals and errors per second by code": {"encoder_requests_total"},
        "Errors by code and kind": {"encoder_request_errors_total"},
        "Cache hit ratio": {"encoder_cache_hits_total", "encoder_cache_misses_total"},
        "Cache bytes against budget": {"encoder_cache_bytes"},
        "DP worker deaths by reason": {"encoder_dp_worker_deaths_total"},
        "DP worker restarts": {"encoder_dp_worker_restarts_total"},
        "TP group restarts": {"encoder_dp_worker_deaths_total"},
        "Delivery failures by backend": {"encoder_delivery_failures_total"},
        "Reconciles per second by result": {"encoderpool_operator_reconciles_total"},
        "Reconcile errors by type": {"encoderpool_operator_reconcile_errors_total"},
        "Pools by status reason": {"encoderpool_operator_pools"},
    }
    read: dict[str, set[str]] = {}
    for query in panel_queries(dashboard.OUTPUT):
        read.setdefault(query.panel, set()).update(metric_names(query.expr))
    for title, series in wanted.items():
        assert series <= read.get(title, set()), (title, read.get(title))
    assert len(read) == sum(len(panels) for _, panels in ROWS)


def test_every_pod_query_selects_the_chosen_pools() -> None:
    for query in panel_queries(dashboard.OUTPUT):
        names = metric_names(query.expr)
        if any(not n.startswith("encoderpool_operator_") for n in names):
            assert query.expr.count('pool=~"$pool"') >= len(names), query.expr
        assert "$pool" not in instantiate(query.expr) and "$__" not in instantiate(query.expr)
