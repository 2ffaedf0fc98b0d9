"""The pool's status, computed by pure functions from what the API server reports.

Inputs: the pool (generation, spec, last written status), its StatefulSet and its pods.
Output: the whole ``status`` object. The reconciler writes it only when it differs from the last
one, and turns changes of ``status.reason`` into Events.

A replica counts as updated only when its pod runs the StatefulSet's update revision, and the
pool is Ready only when ``spec.replicas`` pods are ready on that revision: during a rollout the
old pods still serve (they stay in ``endpoints``), but the pool does not claim to be done.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from encoderpool_operator import names, podstate
from encoderpool_operator.spec import Pool

READY, PROGRESSING, DEGRADED = "Ready", "Progressing", "Degraded"
INVALID_SPEC = "InvalidSpec"
APPLY_FAILED = "ApplyFailed"
ROLLING_UPDATE = "RollingUpdate"
SCALING = "Scaling"
STARTING = "Starting"
WAITING_FOR_STATEFULSET = "WaitingForStatefulSet"
WARNING_REASONS = frozenset({INVALID_SPEC, APPLY_FAILED, *podstate.SEVERITY})
# Shown in status but not worth an Event: the StatefulSet controller catches up within a second.
QUIET_REASONS = frozenset({WAITING_FOR_STATEFULSET})


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the pool."""

    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    """The counts and findings status is made of."""

    desired: int
    pods: int
    ready: int
    updated: int
    ready_updated: int
    sts_current: bool
    revision: str
    endpoints: list[str]
    problems: list[podstate.PodView]


def rfc3339(moment: datetime) -> str:
    """A timestamp as Kubernetes writes it (UTC, seconds, 'Z')."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def observe(pool: Pool, sts: dict[str, Any] | None, pods: list[dict[str, Any]], now: datetime, probe_failing_after: float) -> Observed:
    """Count pods by readiness and revision; terminating pods no longer count."""
    sts_status = (sts or {}).get("status") or {}
    revision = str(sts_status.get("updateRevision") or "")
    generation = int(((sts or {}).get("metadata") or {}).get("generation") or 0)
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    views = sorted((podstate.view(p, now, probe_failing_after) for p in live), key=lambda v: (v.ordinal, v.name))
    updated = [v for v in views if revision and v.revision == revision]
    ready = [v for v in views if v.ready]
    return Observed(
        desired=pool.spec.replicas,
        pods=len(views),
        ready=len(ready),
        updated=len(updated),
        ready_updated=sum(1 for v in updated if v.ready),
        sts_current=sts is not None and int(sts_status.get("observedGeneration") or 0) >= generation > 0,
        revision=revision,
        endpoints=[f"http://{names.pod_dns_name(v.name, pool.name, pool.namespace)}:{pool.spec.port}" for v in ready],
        problems=[v for v in views if v.problem],
    )


def converged(obs: Observed) -> bool:
    """Every wanted pod exists, runs the current revision and is ready, and no extra pod is left."""
    return obs.sts_current and obs.pods == obs.desired and obs.ready_updated == obs.desired


def progress(obs: Observed, startup_timeout: int) -> tuple[str, str] | None:
    """(reason, message) of the change under way, or None when converged."""
    if not obs.sts_current:
        return WAITING_FOR_STATEFULSET, "the StatefulSet controller has not yet observed the latest spec"
    if obs.pods > obs.updated:
        return ROLLING_UPDATE, f"{obs.updated}/{obs.desired} pods on revision {obs.revision}"
    if obs.pods != obs.desired:
        return SCALING, f"{obs.pods} pods, {obs.desired} wanted"
    if obs.ready_updated < obs.desired:
        return STARTING, (
            f"{obs.ready}/{obs.desired} pods ready; the others are loading the model "
            f"(startup budget spec.startupTimeoutSeconds={startup_timeout}s)"
        )
    return None


def degradation(obs: Observed) -> tuple[str, str] | None:
    """(reason, message) of the most severe pod problem, quoting the first pod that has it."""
    if not obs.problems:
        return None
    rank = {reason: i for i, reason in enumerate(podstate.SEVERITY)}
    worst = min(obs.problems, key=lambda v: (rank.get(v.problem or "", len(rank)), v.ordinal))
    count = sum(1 for v in obs.problems if v.problem == worst.problem)
    return worst.problem or "", f"{count} of {obs.pods} pods; {worst.name}: {worst.detail}"


def _condition(kind: str, true: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if true else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def stamp(conditions: list[dict[str, Any]], previous: dict[str, Any], now: datetime) -> list[dict[str, Any]]:
    """Set lastTransitionTime: kept from the previous condition of that type unless its status flipped."""
    before = {c.get("type"): c for c in previous.get("conditions") or []}
    out = []
    for cond in conditions:
        old = before.get(cond["type"])
        keep = old is not None and old.get("status") == cond["status"] and old.get("lastTransitionTime")
        out.append({**cond, "lastTransitionTime": old["lastTransitionTime"] if keep else rfc3339(now)})
    return out


def compute_status(
    pool: Pool,
    sts: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    now: datetime,
    probe_failing_after: float,
) -> dict[str, Any]:
    """The pool's whole status from its StatefulSet and pods."""
    obs = observe(pool, sts, pods, now, probe_failing_after)
    moving = progress(obs, pool.spec.startup_timeout_seconds)
    broken = degradation(obs)
    gen = pool.generation
    if converged(obs):
        reason = "ScaledToZero" if obs.desired == 0 else "AllReplicasReady"
        ready = _condition(READY, True, reason, f"{obs.ready_updated}/{obs.desired} pods ready on revision {obs.revision}", gen)
        top = ("ScaledToZero" if obs.desired == 0 else READY, ready["message"])
    else:
        top = broken or moving or (STARTING, "waiting for pods")
        ready = _condition(READY, False, top[0], top[1], gen)
    conditions = [
        ready,
        _condition(PROGRESSING, moving is not None, moving[0] if moving else "Complete",
                   moving[1] if moving else "the pool matches its spec", gen),
        _condition(DEGRADED, broken is not None, broken[0] if broken else "AsExpected",
                   broken[1] if broken else "no pod reports a problem", gen),
    ]
    return {
        "observedGeneration": gen,
        "replicas": obs.pods,
        "readyReplicas": obs.ready,
        "updatedReplicas": obs.updated,
        "readyText": f"{obs.ready}/{obs.desired}",
        "gpusPerPod": pool.spec.gpus_per_pod,
        "selector": names.selector_string(pool.name),
        "endpoints": obs.endpoints,
        "reason": top[0],
        "message": top[1],
        "conditions": stamp(conditions, pool.status, now),
    }


def failed_status(previous: dict[str, Any], generation: int, reason: str, message: str, now: datetime) -> dict[str, Any]:
    """Status of a pool whose spec cannot be applied (InvalidSpec, ApplyFailed).

    Counts and endpoints stay as last observed: the children keep running the last good spec.
    """
    conditions = [
        _condition(READY, False, reason, message, generation),
        _condition(PROGRESSING, False, reason, "fix the spec; nothing is applied until then", generation),
        _condition(DEGRADED, True, reason, message, generation),
    ]
    return {
        **previous,
        "observedGeneration": generation,
        "reason": reason,
        "message": message,
        "conditions": stamp(conditions, previous, now),
    }


def merge_patch(previous: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON merge patch body turning ``previous`` into ``new``; None when nothing changed."""
    if previous == new:
        return None
    # A merge patch removes a key only when told so with null.
    return {"status": {**{k: None for k in previous if k not in new}, **new}}


def transitions(previous: dict[str, Any], new: dict[str, Any]) -> list[Event]:
    """Events for a change of the pool's top-level reason (one per transition, never per resync)."""
    reason = str(new.get("reason") or "Unknown")
    if previous.get("reason") == reason or reason in QUIET_REASONS:
        return []
    kind = "Warning" if reason in WARNING_REASONS else "Normal"
    return [Event(kind, reason, str(new.get("message") or ""))]
