"""Every API permission the operator process uses, and why.

The chart's ClusterRole grants exactly these (a chart test compares the rendered ClusterRole with
this table), and the control-plane tests run the operator with that ServiceAccount's token, so a
missing verb fails a test instead of a user's cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

from encoderpool_operator import names


@dataclass(frozen=True)
class Rule:
    """One RBAC rule: API group, resource, verbs, and why the operator needs them."""

    group: str
    resource: str
    verbs: tuple[str, ...]
    why: str


RULES: tuple[Rule, ...] = (
    Rule(names.GROUP, names.PLURAL, ("get", "list", "watch", "patch"),
         "kopf watches pools and keeps its progress in their annotations; reconcile reads each pool afresh"),
    Rule(names.GROUP, f"{names.PLURAL}/status", ("patch",), "status is written only through the subresource"),
    Rule(names.GROUP, f"{names.PLURAL}/finalizers", ("update",),
         "children carry blockOwnerDeletion, which OwnerReferencesPermissionEnforcement checks against this"),
    Rule("apps", "statefulsets", ("get", "list", "watch", "create", "patch"),
         "server-side apply (create when absent), drift detection by watch"),
    Rule("", "services", ("get", "list", "watch", "create", "patch", "delete"),
         "the headless Service, same as the StatefulSet; deleted and re-created when a hand edit "
         "(a port changed in place) leaves an apply nothing it can merge"),
    Rule("policy", "poddisruptionbudgets", ("get", "list", "watch", "create", "patch", "delete"),
         "the PDB exists only while replicas > 1, so it is also deleted"),
    Rule("", "pods", ("list", "watch"), "status is computed from the pods; pod events trigger a status refresh"),
    Rule("", "events", ("create",), "Events on pools, by the operator and by kopf"),
    Rule("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch"),
         "kopf notices when the EncoderPool CRD is installed or removed"),
)

# Only when the operator watches a list of namespaces: kopf then follows namespaces appearing.
NAMESPACED_MODE_RULES: tuple[Rule, ...] = (
    Rule("", "namespaces", ("list", "watch"), "kopf resolves the watched namespaces"),
)
