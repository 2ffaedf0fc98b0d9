"""The HTTP edge's answer counters exist at 0 from the start, so a pod's first 504 or 499 shows in rate()."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from encoder_pod.errors import HTTP_STATUS
from encoder_pod.metrics import EdgeMetrics, render

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
