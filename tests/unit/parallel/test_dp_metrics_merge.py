"""Worker metrics merged into the front's exposition, labelled by rank, never counted twice."""

from __future__ import annotations

import pytest

from prometheus_client import CollectorRegistry

from encoder_pod.metrics import EdgeMetrics, ReplicaMetrics, render
from encoder_pod.parallel.ranked_metrics import DataParallelMetrics, merge

pytestmark = pytest.mark.unit


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            out[head] = float(value)
    return out


def test_merge_labels_worker_samples_by_rank_and_keeps_families_whole():
    registry = CollectorRegistry()
    front, dp = EdgeMetrics(registry), DataParallelMetrics(registry)
    front.requests.labels(code="200").inc(3)
    dp.routed.labels(rank="0").inc()
    workers = []
    for rank, batches in ((0, 2), (1, 5)):
        m = ReplicaMetrics()
        for _ in range(batches):
            m.batch_size.observe(2)
        m.queue_depth.set(rank + 1)
        workers.append((rank, m.render()))
    text = merge(render(registry), workers).decode()
    samples = _samples(text)
    assert samples['encoder_requests_total{code="200"}'] == 3
    assert samples['encoder_batch_size_count{rank="0"}'] == 2
    assert samples['encoder_batch_size_count{rank="1"}'] == 5
    assert samples['encoder_batch_size_bucket{rank="1",le="2.0"}'] == 5
    assert samples['encoder_queue_depth{rank="1"}'] == 2
    # One HELP per family, and every sample of a family right after it (Prometheus requires it).
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    assert len(helps) == len(set(helps))
    lines = text.splitlines()
    first = lines.index("# HELP encoder_batch_size Requests per batch.") + 2
    end = next(i for i in range(first, len(lines)) if lines[i].startswith("#"))
    block = lines[first:end]
    assert all(line.startswith("encoder_batch_size_") for line in block)
    assert {'rank="0"' in line for line in block} == {True, False}  # both ranks, in one block


def test_edge_families_only_in_front_and_replica_families_only_in_workers():
    registry = CollectorRegistry()
    EdgeMetrics(registry)
    DataParallelMetrics(registry)
    front, worker = render(registry).decode(), ReplicaMetrics().render().decode()
    assert "encoder_inflight_requests" not in front and "encoder_inflight_requests" in worker
    assert "encoder_request_seconds" in front and "encoder_batch_size" not in front
    assert "encoder_request_seconds" not in worker and "encoder_requests_total" not in worker
    assert "encoder_batch_size" in worker
