"""Metrics in data-parallel mode: the front's own, plus every worker's labelled ``rank="N"``.

Ownership is split so no family is counted twice: the HTTP edge's families
(:class:`~encoder_pod.metrics.EdgeMetrics`) and the ``encoder_dp_*`` families live on the front's
registry; every per-replica family (:class:`~encoder_pod.metrics.ReplicaMetrics`: batches, queue,
forward time, the cache's ...) lives in the workers. Each worker sends its registry's collected
families in its heartbeat as typed samples (:func:`sample_families`); the front's registry holds a
:class:`RankedWorkerMetrics` collector that yields them with a ``rank`` label, so one exposition
(prometheus_client's) renders both and nothing parses or rewrites Prometheus text.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from encoder_pod.parallel.messages import MetricFamily, MetricSample


class DataParallelMetrics:
    """The ``encoder_dp_*`` families, on the front's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.deaths = Counter(
            "encoder_dp_worker_deaths", "Worker process exits not asked for, by rank and reason.", ["rank", "reason"], registry=r
        )
        self.restarts = Counter("encoder_dp_worker_restarts", "Worker processes started again after a death.", ["rank"], registry=r)
        self.up = Gauge("encoder_dp_worker_up", "1 while the rank takes traffic, else 0.", ["rank"], registry=r)
        self.pending = Gauge(
            "encoder_dp_pending_requests", "Requests sent to the rank and not yet answered.", ["rank"], registry=r
        )
        self.routed = Counter("encoder_dp_routed_requests", "Requests sent to the rank.", ["rank"], registry=r)
        self.waiting = Gauge(
            "encoder_dp_waiting_requests", "Requests waiting at the front for a worker slot (every rank full).", registry=r
        )


def sample_families(families: Iterable[Metric]) -> tuple[MetricFamily, ...]:
    """A registry's collected families as the typed tuples a worker's heartbeat carries."""
    out = []
    for family in families:
        cut = len(family.name)
        samples = tuple(MetricSample(s.name[cut:], s.labels, s.value) for s in family.samples)
        out.append(MetricFamily(family.name, family.type, family.documentation, family.unit, samples))
    return tuple(out)


class RankedWorkerMetrics(Collector):
    """Every worker's last reported families, each sample labelled with its ``rank``.

    Registered on the front's registry, so ``/metrics`` renders them with the front's own
    families through prometheus_client's exposition. A family several ranks report is one family
    with every rank's samples (ranks in order). ``ranks`` gives each live worker's families (the
    supervisor forgets a dead worker's, so its series end with it, as a scraped target's do).
    """

    def __init__(self, ranks: Callable[[], Iterable[tuple[int, Sequence[MetricFamily]]]]) -> None:
        self._ranks = ranks

    def collect(self) -> Iterable[Metric]:
        """One :class:`Metric` per family name, every rank's samples in it."""
        merged: dict[str, Metric] = {}
        for rank, families in sorted(self._ranks(), key=lambda pair: pair[0]):
            label = str(rank)
            for family in families:
                metric = merged.get(family.name)
                if metric is None:
                    metric = merged[family.name] = Metric(family.name, family.help, family.type, family.unit)
                for sample in family.samples:
                    metric.add_sample(family.name + sample.suffix, {"rank": label, **sample.labels}, sample.value)
        return merged.values()
