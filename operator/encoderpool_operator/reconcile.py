"""One idempotent reconcile of one pool: read it, apply what changed, observe, write status.

Create, update, resume, child events and the periodic resync all end here. It always reads the
pool afresh, so a caller with a stale copy cannot write a stale status. Children and pods come
from the watch cache (a :class:`Snapshot`), so a reconcile that finds everything as wanted makes
no write at all: no apply, no status patch. It is synchronous: the engine runs it in a worker
thread, one at a time per pool.

Order: every child that needs a write is first applied with ``dryRun=All`` (the API server's own
validation and admission of, say, a spec.podTemplate), then for real, StatefulSet first. A
refusal leaves everything as it was and lands on status as ApplyFailed, which still reports
the pods that run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from encoderpool_operator import names, status
from encoderpool_operator.children import KINDS, OPTIONAL_KINDS, Desired, desired_children
from encoderpool_operator.conditions import Event, merge_patch
from encoderpool_operator.diff import applied_hash, first_difference, up_to_date, without
from encoderpool_operator.errors import ConflictError, InvalidSpecError, NotFoundError, RejectedError
from encoderpool_operator.settings import OperatorSettings
from encoderpool_operator.spec import Pool, identity, parse_pool

log = logging.getLogger(__name__)

MAX_UNAVAILABLE_FIELD = "spec.rollout.maxUnavailable"
MAX_UNAVAILABLE_PATH = ("spec", "updateStrategy", "rollingUpdate", "maxUnavailable")


class Client(Protocol):
    """What reconcile needs from the API server (implemented by client.KubeClient)."""

    def get_pool(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pool, or None when it does not exist."""

    def patch_pool_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the pool's status subresource."""

    def apply(self, manifest: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """Server-side apply one object; returns it as stored (or as it would be)."""

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One object, or None."""

    def delete(self, kind: str, namespace: str, name: str, uid: str) -> None:
        """Delete one object if its uid still matches."""

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Pods matching a label selector."""

    def post_event(self, obj: dict[str, Any], event: Event) -> None:
        """Post an Event about obj (best effort)."""


@dataclass(frozen=True)
class Snapshot:
    """A pool's children (by kind, None when absent) and pods, as the watch cache holds them."""

    children: dict[str, dict[str, Any] | None]
    pods: list[dict[str, Any]]


def read_snapshot(client: Client, namespace: str, name: str) -> Snapshot:
    """A snapshot read from the API server directly, for callers without a watch cache."""
    children = {kind: client.get(kind, namespace, names.child_name(name)) for kind in KINDS}
    return Snapshot(children, client.list_pods(namespace, names.selector_string(name)))


@dataclass(frozen=True)
class Outcome:
    """What one reconcile found and did."""

    found: bool
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    failed: str | None = None  # InvalidSpec/ApplyFailed message: retrying the same spec is futile
    waiting: str | None = None  # children not settled yet: retry soon
    writes: int = 0  # applies, deletes and status patches made
    desired: int | None = None  # spec.replicas, when the spec parsed

    @property
    def ready(self) -> bool:
        """Whether the pool reported Ready."""
        return self.status.get("reason") in {"Ready", "ScaledToZero", status.CANARY}


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


def _apply_one(client: Client, pool: Pool, manifest: dict[str, Any], dry_run: bool) -> dict[str, Any]:
    """Apply one child; a child held by another controller is a conflict, not an invalid spec."""
    kind, name = manifest["kind"], manifest["metadata"]["name"]
    try:
        return client.apply(manifest, dry_run=dry_run)
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
        if dry_run:
            return manifest  # the real apply re-creates it
    log.warning("%s %s/%s: the apply over its hand edits was refused; re-creating it", kind, pool.namespace, name)
    try:
        client.delete(kind, pool.namespace, name, existing["metadata"]["uid"])
    except NotFoundError:
        pass  # gone already: the apply below creates it
    # Refused again means our own manifest is at fault: ApplyFailed, as for any other child.
    return client.apply(manifest)


def why_apply(live: dict[str, Any] | None, manifest: dict[str, Any]) -> str:
    """Why a child is written: for the log, which is how a person tells a spec change from drift."""
    if live is None:
        return "missing"
    unstamped = without(manifest, (("metadata", "annotations", names.MANIFEST_HASH_ANNOTATION),))
    where = first_difference(live, unstamped) or "a field left out"
    if applied_hash(live) != applied_hash(manifest):
        return f"the spec changed it (first at {where})"
    return f"a field the operator owns was edited (drift at {where})"


def ignored_paths(previous: dict[str, Any]) -> tuple[tuple[str, ...], ...]:
    """Manifest paths the cluster is known to drop (from the last status), not to be re-applied."""
    return (MAX_UNAVAILABLE_PATH,) if MAX_UNAVAILABLE_FIELD in (previous.get("ignoredFields") or []) else ()


def apply_children(client: Client, pool: Pool, desired: Desired, live: dict[str, dict[str, Any] | None]) -> tuple[dict[str, dict[str, Any] | None], int]:
    """Dry-run then apply every child that changed, delete unwanted optional ones.

    Returns the children as they now are and the number of writes made.
    """
    ignore = ignored_paths(pool.status)
    changed = [m for m in desired.manifests if not up_to_date(live.get(m["kind"]), m, ignore)]
    for manifest in changed:
        log.info("%s %s/%s: %s; applying", manifest["kind"], pool.namespace, manifest["metadata"]["name"],
                 why_apply(live.get(manifest["kind"]), manifest))
        _apply_one(client, pool, manifest, dry_run=True)
    now = dict(live)
    for manifest in changed:
        now[manifest["kind"]] = _apply_one(client, pool, manifest, dry_run=False)
    writes = len(changed)
    for kind in OPTIONAL_KINDS:
        obj = live.get(kind)
        if desired.of(kind) is not None or obj is None or controller_uid(obj) != pool.uid:
            continue
        try:
            client.delete(kind, pool.namespace, names.child_name(pool.name), obj["metadata"]["uid"])
            writes += 1
        except NotFoundError:
            pass  # already gone: the goal is reached
        now[kind] = None
    return now, writes


def not_in_effect(desired: Desired, sts: dict[str, Any] | None, previous: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(status.ignoredFields, sentences) for spec fields the pods do not get."""
    paths = [f"spec.podTemplate.{c}" for c in desired.collisions]
    notes = []
    if desired.collisions:
        notes.append("spec.podTemplate sets fields the operator owns, which keep the operator's values: "
                     + ", ".join(desired.collisions))
    want_sts = desired.of("StatefulSet") or {}
    wanted = ((want_sts.get("spec") or {}).get("updateStrategy") or {}).get("rollingUpdate", {}).get("maxUnavailable")
    have = (((sts or {}).get("spec") or {}).get("updateStrategy") or {}).get("rollingUpdate", {}).get("maxUnavailable")
    applied = sts is not None and applied_hash(sts) == applied_hash(want_sts)
    if wanted is not None and have is None and applied:
        paths.append(MAX_UNAVAILABLE_FIELD)
        notes.append("spec.rollout.maxUnavailable is dropped by this cluster's API server (StatefulSet "
                     "maxUnavailable needs the MaxUnavailableStatefulSet feature gate, beta and off by default "
                     "in Kubernetes 1.35): pods are replaced one at a time")
    return paths, notes


def _write(client: Client, body: dict[str, Any], previous: dict[str, Any], new: dict[str, Any]) -> tuple[list[Event], int]:
    """Patch status when it changed; post an Event when its reason changed."""
    name, namespace, _, _ = identity(body)
    patch = merge_patch(previous, new)
    if patch is None:
        return [], 0
    client.patch_pool_status(namespace, name, patch)
    events = status.transitions_of(previous, new)
    for event in events:
        client.post_event(body, event)
    return events, 1


def _invalid(client: Client, body: dict[str, Any], message: str, now: datetime) -> Outcome:
    previous = dict(body.get("status") or {})
    _, _, _, generation = identity(body)
    new = status.failed_status(previous, generation, status.INVALID_SPEC, message, now)
    events, writes = _write(client, body, previous, new)
    return Outcome(True, new, events, failed=message, writes=writes)


def reconcile(client: Client, namespace: str, name: str, settings: OperatorSettings, now: datetime,
              snapshot: Snapshot | None = None) -> Outcome:
    """Bring one pool's children and status in line with its spec (idempotent)."""
    body = client.get_pool(namespace, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return Outcome(found=False)  # gone or going: garbage collection removes the children
    try:
        pool = parse_pool(body)
    except InvalidSpecError as exc:
        return _invalid(client, body, str(exc), now)
    seen = snapshot or read_snapshot(client, namespace, name)
    desired = desired_children(pool, settings)
    failure, writes = None, 0
    try:
        children, writes = apply_children(client, pool, desired, seen.children)
    except RejectedError as exc:
        children, failure = seen.children, (status.APPLY_FAILED, f"{exc.resource}: {exc.message}")
    sts = children.get("StatefulSet")
    ignored, notes = not_in_effect(desired, sts, pool.status)
    image = desired.image if failure is None else None
    extras = status.Extras(
        image=image.image if image else pool.status.get("image"),
        image_default_for=image.default_for if image else pool.status.get("imageDefaultFor"),
        ignored=ignored, notes=notes, failure=failure,
    )
    new = status.compute_status(pool, sts, seen.pods, now, settings.probe_failing_after_seconds, extras)
    events, status_writes = _write(client, body, pool.status, new)
    waiting = None
    if failure is None and any(c["reason"] == status.WAITING_FOR_STATEFULSET for c in new["conditions"]):
        waiting = f"StatefulSet {namespace}/{name} not yet observed by its controller"
    return Outcome(True, new, events, failed=failure[1] if failure else None, waiting=waiting,
                   writes=writes + status_writes, desired=pool.spec.replicas)
