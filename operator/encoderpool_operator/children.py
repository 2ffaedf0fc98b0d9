"""The pool's children as manifests: StatefulSet, headless Service, PodDisruptionBudget.

Pure functions (spec -> manifest dict), written by server-side apply. Each manifest carries only
the fields the operator owns: whatever it leaves out stays with the API server's defaults or
other field managers, and whatever it sets is restored on drift.
"""

from __future__ import annotations

from typing import Any

from encoderpool_operator import names
from encoderpool_operator.podtemplate import pod_template
from encoderpool_operator.settings import OperatorSettings
from encoderpool_operator.spec import Pool


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


def statefulset(pool: Pool, settings: OperatorSettings) -> dict[str, Any]:
    """The pods. A StatefulSet gives each pod a stable DNS name for routers' --encoder-urls.

    Parallel pod management: encoder pods do not depend on each other, and loading several
    models at once is much faster than one after another. Rolling updates replace one pod at a
    time without a surge pod, so an upgrade never needs GPUs beyond spec.replicas x GPUs per pod.
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
            "updateStrategy": {"type": "RollingUpdate"},
            "template": pod_template(pool.name, pool.spec, settings),
        },
    }


def service(pool: Pool) -> dict[str, Any]:
    """The headless Service behind the pods' DNS names.

    publishNotReadyAddresses is false: the Service exists for routers, and a router must only
    reach encoders whose readiness probe (a real encode) passes. Encoder pods never talk to each
    other, so nothing needs the DNS names of pods that are still loading.
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
                {"name": names.PORT_NAME, "port": pool.spec.port, "targetPort": names.PORT_NAME, "protocol": "TCP"}
            ],
        },
    }


def pod_disruption_budget(pool: Pool) -> dict[str, Any] | None:
    """At most one pod voluntarily evicted at a time; none for a single pod (it would block drains)."""
    if pool.spec.replicas <= 1:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(pool),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": names.selector_labels(pool.name)}},
    }


def desired_children(pool: Pool, settings: OperatorSettings) -> list[dict[str, Any]]:
    """Everything to apply, Service first so pods find their DNS domain when they start."""
    out = [service(pool), statefulset(pool, settings)]
    pdb = pod_disruption_budget(pool)
    if pdb is not None:
        out.append(pdb)
    return out
