"""Worker metrics in the front's exposition: typed samples over the wire, labelled by rank, never counted twice."""

from __future__ import annotations

import msgpack
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from encoder_pod.cache.lookup import ItemCache
from encoder_pod.metrics import EdgeMetrics, ReplicaMetrics, render
from encoder_pod.parallel.messages import ProtocolError, Status, pack, unpack
from encoder_pod.parallel.ranked_metrics import DataParallelMetrics, RankedWorkerMetrics, sample_families
from encoder_pod.readiness import ReplicaState

pytestmark = pytest.mark.unit

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _series(text: str) -> Series:
    """Every sample of an exposition, parsed by prometheus_client's own parser: (name, labels) -> value."""
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in out, f"series {key} exposed twice"
            out[key] = sample.value
    return out


def _worker(rank: int, batches: int) -> ReplicaMetrics:
    """A worker's registry as a served replica fills it: the replica's families, the cache's, declared series."""
    m = ReplicaMetrics()
    ItemCache(1 << 20, m.registry)
    m.declare(["image", "video"], ["inline"])
    for _ in range(batches):
        m.batch_size.observe(2)
        m.delivery_latency.labels(backend="inline").observe(0.01)
    m.items.labels(modality="image").inc(batches)
    m.queue_depth.set(rank + 1)
    return m


def _heartbeat(rank: int, m: ReplicaMetrics) -> Status:
    """The worker's Status as the front receives it: packed, sent, unpacked."""
    sent = Status(rank, 1, 100 + rank, ReplicaState.READY, None, 1.0, metrics=sample_families(m.registry.collect()))
    msg, _ = unpack(pack(sent))
    assert isinstance(msg, Status)
    return msg


def _front(workers: dict[int, Status]) -> tuple[CollectorRegistry, EdgeMetrics, DataParallelMetrics]:
    registry = CollectorRegistry()
    edge, dp = EdgeMetrics(registry), DataParallelMetrics(registry)
    registry.register(RankedWorkerMetrics(lambda: [(rank, s.metrics or ()) for rank, s in workers.items()]))
    return registry, edge, dp


def test_dp2_exposition_is_the_front_series_plus_every_worker_series_with_its_rank():
    """What a user scrapes: exactly the front's series, and each worker's own series (as its
    registry alone exposes them) with a rank label; no family twice, values as recorded."""
    replicas = {0: _worker(0, 2), 1: _worker(1, 5)}
    workers = {rank: _heartbeat(rank, m) for rank, m in replicas.items()}
    registry, edge, dp = _front(workers)
    edge.requests.labels(code="200").inc(3)
    dp.routed.labels(rank="0").inc()

    text = render(registry).decode()
    front_alone = CollectorRegistry()
    EdgeMetrics(front_alone).requests.labels(code="200").inc(3)
    DataParallelMetrics(front_alone).routed.labels(rank="0").inc()
    expected = _series(render(front_alone).decode())
    for rank, m in replicas.items():
        for (name, labels), value in _series(m.render().decode()).items():
            expected[(name, labels | {("rank", str(rank))})] = value
    got = _series(text)
    assert got.keys() == expected.keys()

    def values(series: Series) -> Series:  # the front's _created are its own registry's start times
        return {key: v for key, v in series.items() if not key[0].endswith("_created") or ("rank", "1") in key[1]}

    assert values(got) == values(expected)
    assert got[("encoder_batch_size_count", frozenset({("rank", "1")}))] == 5
    assert got[("encoder_batch_size_bucket", frozenset({("rank", "1"), ("le", "2.0")}))] == 5
    assert got[("encoder_queue_depth", frozenset({("rank", "1")}))] == 2
    assert got[("encoder_requests_total", frozenset({("code", "200")}))] == 3

    # One HELP per family, and every sample of a family right after it (Prometheus requires it).
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    assert len(helps) == len(set(helps))
    lines = text.splitlines()
    first = lines.index("# HELP encoder_batch_size Requests per batch.") + 2
    end = next(i for i in range(first, len(lines)) if lines[i].startswith("#"))
    block = lines[first:end]
    assert all(line.startswith("encoder_batch_size_") for line in block)
    assert {'rank="0"' in line for line in block} == {True, False}  # both ranks, in one block


def test_a_worker_that_stops_reporting_leaves_the_exposition():
    """The front forgets a dead worker's families (its incarnation's are dropped at exit): its series
    end with it, the front's ``encoder_dp_*`` series of that rank stay."""
    workers = {rank: _heartbeat(rank, _worker(rank, 1)) for rank in (0, 1)}
    registry, _, dp = _front(workers)
    dp.up.labels(rank="1").set(0)
    del workers[1]
    got = _series(render(registry).decode())
    assert ("encoder_batch_size_count", frozenset({("rank", "0")})) in got
    assert not [key for key in got if ("rank", "1") in key[1] and not key[0].startswith("encoder_dp_")]
    assert got[("encoder_dp_worker_up", frozenset({("rank", "1")}))] == 0


def test_malformed_metrics_are_a_protocol_error():
    good = pack(Status(0, 1, 1, ReplicaState.READY, None, 1.0, metrics=sample_families(ReplicaMetrics().registry.collect())))
    fields = msgpack.unpackb(good[0])
    for bad in ([["x", "nonsense", "h", "", []]], [["x", "gauge", "h", "", [["", "not labels", 1.0]]]], "text", [[1]]):
        with pytest.raises(ProtocolError, match="Status"):
            unpack([msgpack.packb({**fields, "metrics": bad})])


def test_edge_families_only_in_front_and_replica_families_only_in_workers():
    registry = CollectorRegistry()
    EdgeMetrics(registry)
    DataParallelMetrics(registry)
    front, worker = render(registry).decode(), ReplicaMetrics().render().decode()
    assert "encoder_inflight_requests" not in front and "encoder_inflight_requests" in worker
    assert "encoder_request_seconds" in front and "encoder_batch_size" not in front
    assert "encoder_request_seconds" not in worker and "encoder_requests_total" not in worker
    assert "encoder_batch_size" in worker
