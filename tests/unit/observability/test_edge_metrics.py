"""The answer, item and delivery-failure counters exist at 0 from the start, so a pod's first 504, 499 or
failed push shows in rate()."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from encoder_pod.errors import HTTP_STATUS
from encoder_pod.metrics import EdgeMetrics, ReplicaMetrics, render
from encoder_pod.settings import TransferSettings
from encoder_pod.transfer.router import TransferRouter

pytestmark = pytest.mark.unit


def test_every_answer_code_and_error_kind_is_exported_at_zero_before_any_request() -> None:
    registry = CollectorRegistry()
    EdgeMetrics(registry, max_queue=4)
    text = render(registry).decode()
    for kind, status in HTTP_STATUS.items():
        assert f'encoder_requests_total{{code="{status}"}} 0.0' in text
        assert f'encoder_request_errors_total{{code="{status}",kind="{kind.value}"}} 0.0' in text
    assert 'encoder_requests_total{code="200"} 0.0' in text
    assert 'encoder_request_errors_total{code="499",kind="client_gone"} 0.0' in text


def test_a_replica_exports_its_modalities_and_delivery_failures_at_zero() -> None:
    metrics = ReplicaMetrics()
    metrics.declare(["IMAGE", "AUDIO"], ["zmq_to_scheduler"])
    text = metrics.render().decode()
    assert 'encoder_items_total{modality="IMAGE"} 0.0' in text and 'encoder_items_total{modality="AUDIO"} 0.0' in text
    assert 'modality="VIDEO"' not in text  # only what the model takes
    for kind in ("transfer_failed", "timeout"):
        assert f'encoder_delivery_failures_total{{backend="zmq_to_scheduler",kind="{kind}"}} 0.0' in text


def test_an_inline_pod_declares_no_delivery_backend() -> None:
    router = TransferRouter(TransferSettings(transfer_backend="inline"), max_registrations=4)
    assert router.delivering == []
