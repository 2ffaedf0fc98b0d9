"""The operator's HTTP endpoint (a real server on loopback) and its metrics."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from encoderpool_operator.client import resource_of
from encoderpool_operator import errors
from encoderpool_operator.engine import error_types
from encoderpool_operator.metrics import OperatorMetrics
from encoderpool_operator.serving import StatusServer

pytestmark = pytest.mark.unit


@pytest.fixture
def server() -> Iterator[tuple[StatusServer, list[bool]]]:
    health = [True]
    metrics = OperatorMetrics()
    srv = StatusServer(0, metrics, healthy=lambda: health[0], host="127.0.0.1")
    srv.start()
    try:
        yield srv, health
    finally:
        srv.close()


def test_health_and_metrics_are_served(server: tuple[StatusServer, list[bool]]) -> None:
    srv, health = server
    base = f"http://127.0.0.1:{srv.port}"
    srv.metrics.reconciles.labels("ok").inc(3)
    srv.metrics.pool_reason("ml", "a", "Ready")
    srv.metrics.pool_reason("ml", "b", "Unschedulable")
    srv.metrics.api_request("PATCH", "statefulsets", dry_run=True)
    assert httpx.get(base + "/healthz").status_code == 200
    text = httpx.get(base + "/metrics").text
    assert 'encoderpool_operator_reconciles_total{result="ok"} 3.0' in text
    assert 'encoderpool_operator_pools{reason="Unschedulable"} 1.0' in text
    assert 'encoderpool_operator_api_requests_total{dry_run="true",resource="statefulsets",verb="PATCH"} 1.0' in text
    health[0] = False
    assert httpx.get(base + "/healthz").status_code == 503
    assert httpx.get(base + "/nope").status_code == 404


def test_pools_by_reason_follow_each_pools_latest_reason() -> None:
    metrics = OperatorMetrics()
    metrics.pool_reason("ml", "a", "Starting")
    metrics.pool_reason("ml", "a", "Ready")
    metrics.pool_reason("ml", "b", "Ready")
    metrics.pool_reason("ml", "b", None)  # deleted
    value = metrics.registry.get_sample_value
    assert value("encoderpool_operator_pools", {"reason": "Ready"}) == 1
    assert value("encoderpool_operator_pools", {"reason": "Starting"}) == 0


def test_each_pools_replicas_and_current_conditions_are_gauges_that_follow_it() -> None:
    metrics = OperatorMetrics()
    value = metrics.registry.get_sample_value
    starting = {"readyReplicas": 1, "conditions": [
        {"type": "Ready", "status": "False", "reason": "Starting"},
        {"type": "Progressing", "status": "True", "reason": "Starting"}]}
    metrics.pool_status("ml", "a", starting, desired=2)
    replicas = "encoderpool_operator_pool_replicas"
    assert value(replicas, {"pool_namespace": "ml", "pool": "a", "state": "desired"}) == 2
    assert value(replicas, {"pool_namespace": "ml", "pool": "a", "state": "ready"}) == 1
    stalled = {"readyReplicas": 1, "conditions": [
        {"type": "Ready", "status": "False", "reason": "Starting"},
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}
    metrics.pool_status("ml", "a", stalled, desired=2)
    cond = "encoderpool_operator_pool_condition"
    labels = {"pool_namespace": "ml", "pool": "a", "type": "Progressing"}
    assert value(cond, {**labels, "status": "False", "reason": "ProgressDeadlineExceeded"}) == 1
    assert value(cond, {**labels, "status": "True", "reason": "Starting"}) is None  # the old one is gone, not 0
    metrics.pool_status("ml", "a", None, desired=None)  # deleted: no series of it is left
    assert "pool=\"a\"" not in metrics.render().decode()


@pytest.mark.parametrize(
    ("path", "resource", "collection"),
    [
        ("/api/v1/namespaces/ml/pods", "pods", True),
        ("/api/v1/namespaces/ml/pods/enc-0", "pods", False),
        ("/apis/apps/v1/namespaces/ml/statefulsets/enc", "statefulsets", False),
        ("/apis/encoderpool.io/v1alpha1/namespaces/ml/encoderpools/enc/status", "encoderpools/status", False),
        ("/apis/encoderpool.io/v1alpha1/encoderpools", "encoderpools", True),
        ("/api/v1/namespaces", "namespaces", True),
    ],
)
def test_requests_are_counted_by_resource(path: str, resource: str, collection: bool) -> None:
    assert resource_of(path) == (resource, collection)


def test_every_reconcile_error_type_is_a_label_known_before_the_first_error() -> None:
    names = error_types()
    assert {"UnavailableError", "ConflictError", "ForbiddenError", "InvalidSpecError"} <= set(names)
    assert all(issubclass(getattr(errors, name), errors.OperatorError) for name in names)
