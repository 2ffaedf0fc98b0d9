"""Every API permission the operator process uses, and why.

The chart grants exactly these (a chart test compares the rendered rules with these tables): RULES
through a ClusterRole, or through a Role in each watched namespace when ``watchNamespaces`` is
set; LEASE_RULES through a Role in the operator's namespace. The control-plane tests run the
operator with that ServiceAccount's token, so a missing verb fails a test instead of a user's
cluster. No rule is cluster-scoped by nature: kopf's cluster scanning (CRDs, namespaces) is off.
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
         "server-side apply (create when absent, dry run first), the watch cache and drift detection"),
    Rule("", "services", ("get", "list", "watch", "create", "patch", "delete"),
         "the headless Service, same as the StatefulSet; deleted and re-created when a hand edit "
         "(a port changed in place) leaves an apply nothing it can merge"),
    Rule("policy", "poddisruptionbudgets", ("get", "list", "watch", "create", "patch", "delete"),
         "the PDB exists only while replicas > 1 or autoscaling is on, so it is also deleted"),
    Rule("autoscaling", "horizontalpodautoscalers", ("get", "list", "watch", "create", "patch", "delete"),
         "the HPA of spec.autoscaling, deleted when autoscaling is turned off"),
    Rule("", "pods", ("list", "watch"), "the watch cache status is computed from; pod events trigger a status refresh"),
    Rule("", "events", ("create",), "Events on pools, by the operator and by kopf"),
)

# In the operator's own namespace only: the leader election Lease.
LEASE_RULES: tuple[Rule, ...] = (
    Rule("coordination.k8s.io", "leases", ("get", "create", "update"),
         "leader election: the replicas compete for one Lease, and only its holder runs"),
)
