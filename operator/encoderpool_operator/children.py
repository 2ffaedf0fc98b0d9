"""The pool's children as manifests: StatefulSet, headless Service, PodDisruptionBudget, HPA.

Pure functions (spec -> manifest dict), written by server-side apply. Each manifest carries only
the fields the operator owns: whatever it leaves out stays with the API server's defaults or
other field managers, and whatever it sets is restored on drift. Each also carries a hash of
itself (``encoderpool.io/manifest-hash``), so that a child already as wanted is not written again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from encoderpool_operator import names
from encoderpool_operator.podtemplate import ImageChoice, pod_template
from encoderpool_operator.settings import OperatorSettings
from encoderpool_operator.spec import Pool

# Apply order. The StatefulSet goes first: if it is refused (an invalid spec.podTemplate, say)
# nothing else moves, so the Service never advertises a port no pod has. Pods resolve the
# Service's named targetPort each on their own, so both revisions stay reachable mid-rollout.
KINDS = ("StatefulSet", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler")
# Children that exist only in some specs, and are deleted when the spec no longer wants them.
OPTIONAL_KINDS = ("PodDisruptionBudget", "HorizontalPodAutoscaler")


@dataclass(frozen=True)
class Desired:
    """Everything to apply, in order, and what the pod template could not honour."""

    manifests: list[dict[str, Any]]
    image: ImageChoice
    collisions: list[str] = field(default_factory=list)

    def of(self, kind: str) -> dict[str, Any] | None:
        """The manifest of one kind, if wanted."""
        return next((m for m in self.manifests if m["kind"] == kind), None)


def owner_reference(pool: Pool) -> dict[str, Any]:
    """The pool as the controlling owner: deleting the pool garbage-collects its children."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "name": pool.name,
        "uid": pool.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(pool: Pool) -> dict[str, Any]:
    return {
        "name": names.child_name(pool.name),
        "namespace": pool.namespace,
        "labels": names.common_labels(pool.name),
        "ownerReferences": [owner_reference(pool)],
    }


def manifest_hash(manifest: dict[str, Any]) -> str:
    """A hash of a manifest without its own hash annotation."""
    meta = dict(manifest.get("metadata") or {})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != names.MANIFEST_HASH_ANNOTATION}
    body = {**manifest, "metadata": {**meta, "annotations": annotations}}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def stamped(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with its hash annotation."""
    meta = manifest["metadata"]
    annotations = {**(meta.get("annotations") or {}), names.MANIFEST_HASH_ANNOTATION: manifest_hash(manifest)}
    return {**manifest, "metadata": {**meta, "annotations": annotations}}


def update_strategy(pool: Pool) -> dict[str, Any]:
    """RollingUpdate with spec.rollout's partition (always written) and maxUnavailable.

    partition: pods with an ordinal >= partition move to the new revision, the highest first,
    the others stay (a canary). It is written even at 0: without a rollingUpdate block the
    StatefulSet controller picks the revision of a pod it recreates from status.currentReplicas,
    and a status read before its own last write recreates a pod the rollout has just replaced on
    the OLD revision (it loads the old model, or stays Pending and stalls the rollout, before it
    is replaced again). With a partition the choice is ordinal >= partition: the new revision.
    maxUnavailable > 1 replaces several pods at once; StatefulSets honour it only with the
    MaxUnavailableStatefulSet feature gate, and status says when not.
    """
    rollout = pool.spec.rollout
    rolling: dict[str, Any] = {"partition": rollout.partition}
    if rollout.max_unavailable != 1:
        rolling["maxUnavailable"] = rollout.max_unavailable
    return {"type": "RollingUpdate", "rollingUpdate": rolling}


def statefulset(pool: Pool, settings: OperatorSettings, template: dict[str, Any]) -> dict[str, Any]:
    """The pods. A StatefulSet gives each pod a stable DNS name for routers' --encoder-urls.

    Parallel pod management: encoder pods do not depend on each other, and loading several
    models at once is much faster than one after another. Rolling updates replace pods without
    a surge pod, so an upgrade never needs GPUs beyond spec.replicas x GPUs per pod.
    """
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(pool),
        "spec": {
            "replicas": pool.spec.replicas,
            "serviceName": names.child_name(pool.name),
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": names.selector_labels(pool.name)},
            "updateStrategy": update_strategy(pool),
            "template": template,
        },
    }


def service(pool: Pool) -> dict[str, Any]:
    """The headless Service behind the pods' DNS names.

    publishNotReadyAddresses is false: the Service exists for routers, and a router must only
    reach encoders whose readiness probe passes (a terminating pod drops out at once).
    """
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(pool),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": False,
            "selector": names.selector_labels(pool.name),
            "ports": [
                {"name": names.PORT_NAME, "port": pool.spec.port, "targetPort": names.PORT_NAME, "protocol": "TCP"},
                *([{"name": names.GRPC_PORT_NAME, "port": pool.spec.grpc.port, "targetPort": names.GRPC_PORT_NAME,
                    "protocol": "TCP"}] if pool.spec.grpc.port is not None else []),
            ],
        },
    }


def pod_disruption_budget(pool: Pool) -> dict[str, Any] | None:
    """At most one pod voluntarily evicted at a time; none for a single pod (it would block drains)."""
    if pool.spec.replicas <= 1 and pool.spec.autoscaling is None:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(pool),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": names.selector_labels(pool.name)}},
    }


def horizontal_pod_autoscaler(pool: Pool) -> dict[str, Any] | None:
    """An autoscaling/v2 HPA on the pool's scale subresource, from a per-pod custom metric.

    The HPA controller reads the metric through the custom metrics API
    (custom.metrics.k8s.io, served by prometheus-adapter or KEDA's metrics server) for the pods
    of status.selector, and writes spec.replicas of the pool, which the operator passes on.
    """
    auto = pool.spec.autoscaling
    if auto is None:
        return None
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": names.API_VERSION, "kind": names.KIND, "name": pool.name},
        "minReplicas": auto.min_replicas,
        "maxReplicas": auto.max_replicas,
        "metrics": [{"type": "Pods", "pods": {
            "metric": {"name": auto.metric_name},
            "target": {"type": "AverageValue", "averageValue": str(auto.target_average_value)},
        }}],
    }
    if auto.behavior:
        spec["behavior"] = auto.behavior
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": _metadata(pool),
            "spec": spec}


def desired_children(pool: Pool, settings: OperatorSettings) -> Desired:
    """Everything to apply, in apply order (see KINDS), each stamped with its hash."""
    rendered = pod_template(pool.name, pool.spec, settings, pool.status)
    manifests = [statefulset(pool, settings, rendered.template), service(pool),
                 pod_disruption_budget(pool), horizontal_pod_autoscaler(pool)]
    return Desired([stamped(m) for m in manifests if m is not None], rendered.image, rendered.collisions)
