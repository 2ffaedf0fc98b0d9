"""One idempotent reconcile of one pool: read it, apply its children, observe them, write status.

Create, update, resume, child events and the periodic resync all end here. It always reads the
pool afresh, so a caller with a stale copy cannot write a stale status. It is synchronous: the
engine runs it in a worker thread, one at a time per pool.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from encoderpool_operator import names, status
from encoderpool_operator.children import desired_children
from encoderpool_operator.errors import ConflictError, InvalidSpecError, NotFoundError, RejectedError
from encoderpool_operator.settings import OperatorSettings
from encoderpool_operator.spec import Pool, identity, parse_pool

log = logging.getLogger(__name__)


class Client(Protocol):
    """What reconcile needs from the API server (implemented by client.KubeClient)."""

    def get_pool(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pool, or None when it does not exist."""

    def patch_pool_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the pool's status subresource."""

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply one object; returns it as stored."""

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One object, or None."""

    def delete(self, kind: str, namespace: str, name: str, uid: str) -> None:
        """Delete one object if its uid still matches."""

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Pods matching a label selector."""

    def post_event(self, obj: dict[str, Any], event: status.Event) -> None:
        """Post an Event about obj (best effort)."""


@dataclass(frozen=True)
class Outcome:
    """What one reconcile found and did."""

    found: bool
    status: dict[str, Any] = field(default_factory=dict)
    events: list[status.Event] = field(default_factory=list)
    failed: str | None = None  # InvalidSpec/ApplyFailed message: retrying the same spec is futile
    waiting: str | None = None  # children not settled yet: retry soon

    @property
    def ready(self) -> bool:
        """Whether the pool reported Ready."""
        return self.status.get("reason") in {status.READY, "ScaledToZero"}


def controller_uid(obj: dict[str, Any]) -> str | None:
    """uid of the object's controlling owner, if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


# Children that are deleted and applied afresh when the API server refuses to merge the apply into
# a hand-edited copy of our own. A Service's ports are a list keyed by (port, protocol): a port
# changed in place makes our port a second entry with the same name ("Duplicate value"), which no
# apply can undo. A headless Service holds no state; recreating it only renews its EndpointSlices.
# Never the StatefulSet: its pods would go with it.
RECREATE_ON_REJECT = frozenset({"Service"})


def _apply_one(client: Client, pool: Pool, manifest: dict[str, Any]) -> dict[str, Any]:
    """Apply one child; a child held by another controller is a conflict, not an invalid spec."""
    kind, name = manifest["kind"], manifest["metadata"]["name"]
    try:
        return client.apply(manifest)
    except RejectedError:
        existing = client.get(kind, pool.namespace, name)
        owner = controller_uid(existing) if existing else None
        if owner is not None and owner != pool.uid:
            # Typically the children of a deleted pool of the same name, not yet collected.
            raise ConflictError(
                f"{kind} {pool.namespace}/{name} is controlled by "
                f"another owner (uid {owner}); waiting for it to be deleted",
                status=409,
            ) from None
        if existing is None or owner != pool.uid or kind not in RECREATE_ON_REJECT:
            raise
    log.warning("%s %s/%s: the apply over its hand edits was refused; re-creating it", kind, pool.namespace, name)
    try:
        client.delete(kind, pool.namespace, name, existing["metadata"]["uid"])
    except NotFoundError:
        pass  # gone already: the apply below creates it
    # Refused again means our own manifest is at fault: ApplyFailed, as for any other child.
    return client.apply(manifest)


def apply_children(client: Client, pool: Pool, settings: OperatorSettings) -> dict[str, Any]:
    """Server-side apply every child; remove a PDB no longer wanted. Returns the applied StatefulSet."""
    sts: dict[str, Any] = {}
    kinds = set()
    for manifest in desired_children(pool, settings):
        applied = _apply_one(client, pool, manifest)
        kinds.add(manifest["kind"])
        if manifest["kind"] == "StatefulSet":
            sts = applied
    if "PodDisruptionBudget" not in kinds:
        pdb = client.get("PodDisruptionBudget", pool.namespace, names.child_name(pool.name))
        if pdb is not None and controller_uid(pdb) == pool.uid:
            try:
                client.delete("PodDisruptionBudget", pool.namespace, names.child_name(pool.name), pdb["metadata"]["uid"])
            except NotFoundError:
                pass  # already gone: the goal is reached
    return sts


def _write(client: Client, body: dict[str, Any], previous: dict[str, Any], new: dict[str, Any]) -> list[status.Event]:
    """Patch status when it changed; post an Event when its reason changed."""
    name, namespace, _, _ = identity(body)
    patch = status.merge_patch(previous, new)
    if patch is None:
        return []
    client.patch_pool_status(namespace, name, patch)
    events = status.transitions(previous, new)
    for event in events:
        client.post_event(body, event)
    return events


def _fail(client: Client, body: dict[str, Any], reason: str, message: str, now: datetime) -> Outcome:
    previous = dict(body.get("status") or {})
    _, _, _, generation = identity(body)
    new = status.failed_status(previous, generation, reason, message, now)
    return Outcome(True, new, _write(client, body, previous, new), failed=message)


def reconcile(client: Client, namespace: str, name: str, settings: OperatorSettings, now: datetime) -> Outcome:
    """Bring one pool's children and status in line with its spec (idempotent)."""
    body = client.get_pool(namespace, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return Outcome(found=False)  # gone or going: garbage collection removes the children
    try:
        pool = parse_pool(body)
    except InvalidSpecError as exc:
        return _fail(client, body, status.INVALID_SPEC, str(exc), now)
    try:
        sts = apply_children(client, pool, settings)
    except RejectedError as exc:
        return _fail(client, body, status.APPLY_FAILED, f"{exc.resource}: {exc.message}", now)
    pods = client.list_pods(namespace, names.selector_string(name))
    new = status.compute_status(pool, sts, pods, now, settings.probe_failing_after_seconds)
    events = _write(client, body, pool.status, new)
    waiting = None
    if any(c["reason"] == status.WAITING_FOR_STATEFULSET for c in new["conditions"]):
        waiting = f"StatefulSet {namespace}/{name} not yet observed by its controller"
    return Outcome(True, new, events, waiting=waiting)
