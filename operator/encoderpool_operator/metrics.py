"""The operator's own Prometheus metrics, on one registry per process (no module-level state).

Served on GET /metrics of the operator's HTTP endpoint (``serving.py``). Names:

- ``encoderpool_operator_reconciles_total{result}``: ok, waiting, failed (InvalidSpec or
  ApplyFailed) and error (an exception: the API server unreachable, a conflict);
- ``encoderpool_operator_reconcile_errors_total{error}``: exceptions by operator error type;
- ``encoderpool_operator_reconcile_duration_seconds``: a histogram of whole reconciles;
- ``encoderpool_operator_pools{reason}``: pools by the reason of their last status;
- ``encoderpool_operator_pool_replicas{pool_namespace,pool,state}``: each pool's pods wanted
  (``state="desired"``, spec.replicas) and ready (``state="ready"``);
- ``encoderpool_operator_pool_condition{pool_namespace,pool,type,status,reason}``: 1 for each
  condition a pool reports now (Ready, Progressing, Degraded, SpecApplied). The pool's namespace
  is ``pool_namespace``: a scrape sets ``namespace`` to the operator's own;
- ``encoderpool_operator_writes_total{resource}``: applies, deletes and status patches made by
  reconciles (a no-op resync adds none);
- ``encoderpool_operator_api_requests_total{verb,resource,dry_run}``: every API request;
- ``encoderpool_operator_watch_events_total{resource}`` and
  ``encoderpool_operator_nudges_total{outcome}`` (ran or coalesced): how events become reconciles;
- ``encoderpool_operator_leader`` (1 while this replica leads) and
  ``encoderpool_operator_leader_transitions_total``.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PREFIX = "encoderpool_operator"
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class OperatorMetrics:
    """Every metric of one operator process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.reconciles = Counter(f"{PREFIX}_reconciles", "Reconciles by result.", ["result"], registry=r)
        self.errors = Counter(f"{PREFIX}_reconcile_errors", "Reconciles that raised, by error.", ["error"],
                              registry=r)
        self.duration = Histogram(f"{PREFIX}_reconcile_duration_seconds", "Duration of one reconcile.",
                                  buckets=DURATION_BUCKETS, registry=r)
        self.pools = Gauge(f"{PREFIX}_pools", "Pools by the reason of their status.", ["reason"], registry=r)
        self.pool_replicas = Gauge(f"{PREFIX}_pool_replicas", "A pool's pods: desired (spec.replicas) and ready.",
                                   ["pool_namespace", "pool", "state"], registry=r)
        self.pool_conditions = Gauge(f"{PREFIX}_pool_condition", "1 for each condition a pool reports now.",
                                     ["pool_namespace", "pool", "type", "status", "reason"], registry=r)
        self.writes = Counter(f"{PREFIX}_writes", "Writes made by reconciles.", registry=r)
        self.requests = Counter(f"{PREFIX}_api_requests", "API requests.", ["verb", "resource", "dry_run"],
                                registry=r)
        self.events = Counter(f"{PREFIX}_watch_events", "Watch events received.", ["resource"], registry=r)
        self.nudges = Counter(f"{PREFIX}_nudges", "Reconcile requests from events and resyncs.", ["outcome"],
                              registry=r)
        self.leader = Gauge(f"{PREFIX}_leader", "1 while this replica holds the leader lease.", registry=r)
        self.transitions = Counter(f"{PREFIX}_leader_transitions", "Times this replica became leader.",
                                   registry=r)
        self._lock = threading.Lock()
        self._reasons: dict[tuple[str, str], str] = {}
        self._reported: set[str] = set()
        self._conditions: dict[tuple[str, str], set[tuple[str, str, str]]] = {}

    def api_request(self, verb: str, resource: str, dry_run: bool = False) -> None:
        """Count one API request."""
        self.requests.labels(verb, resource, "true" if dry_run else "false").inc()

    def pool_reason(self, namespace: str, name: str, reason: str | None) -> None:
        """Record a pool's current reason (None: the pool is gone)."""
        with self._lock:
            if reason is None:
                self._reasons.pop((namespace, name), None)
            else:
                self._reasons[(namespace, name)] = reason
            counts: dict[str, int] = {}
            for value in self._reasons.values():
                counts[value] = counts.get(value, 0) + 1
            for value in self._reported | set(counts):  # a reason no pool has any more goes to 0
                self.pools.labels(value).set(counts.get(value, 0))
            self._reported |= set(counts)

    def pool_status(self, namespace: str, name: str, status: dict[str, Any] | None, desired: int | None) -> None:
        """Record a pool's replicas and conditions (``status`` None: the pool is gone)."""
        with self._lock:
            for cond in self._conditions.pop((namespace, name), set()):
                self.pool_conditions.remove(namespace, name, *cond)
            if status is None:
                for state in ("desired", "ready"):
                    try:
                        self.pool_replicas.remove(namespace, name, state)
                    except KeyError:
                        pass
                return
            if desired is not None:
                self.pool_replicas.labels(namespace, name, "desired").set(desired)
            self.pool_replicas.labels(namespace, name, "ready").set(int(status.get("readyReplicas") or 0))
            current = {(str(c.get("type")), str(c.get("status")), str(c.get("reason")))
                       for c in status.get("conditions") or []}
            for cond in current:
                self.pool_conditions.labels(namespace, name, *cond).set(1)
            self._conditions[(namespace, name)] = current

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
