"""The pool's status, computed by pure functions from what the API server reports.

Inputs: the pool (generation, spec, last written status), its StatefulSet and its pods, and what
the reconcile learnt while applying (the image chosen, spec fields not in effect, an apply
refused). Output: the whole ``status`` object. The reconciler writes it only when it differs
from the last one, and turns changes of ``status.reason`` into Events.

A replica counts as updated only when its pod runs the StatefulSet's update revision, and the
pool is Ready only when ``spec.replicas`` pods are ready on that revision (or, with a
``spec.rollout.partition``, every pod at or above the partition is). ``status.endpoints`` never
mixes revisions during a rollout: it lists the ready pods of the update revision as soon as one
is ready, and until then those of the previous revision. Only a canary (a partition) serves
from both on purpose; ``status.revisions`` tells their endpoints apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from encoderpool_operator import names, podstate
from encoderpool_operator.conditions import (
    DEGRADED,
    PROGRESSING,
    READY,
    SPEC_APPLIED,
    Event,
    condition,
    merge_patch,
    parse_time,
    rfc3339,
    stamp,
    transitions,
)
from encoderpool_operator.spec import Pool

INVALID_SPEC = "InvalidSpec"
APPLY_FAILED = "ApplyFailed"
ROLLING_UPDATE = "RollingUpdate"
SCALING = "Scaling"
STARTING = "Starting"
CANARY = "Canary"
PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
WAITING_FOR_STATEFULSET = "WaitingForStatefulSet"
PROTECTED_FIELD_OVERRIDE = "ProtectedFieldOverride"
FEATURE_GATE_MISSING = "FeatureGateMissing"
WARNING_REASONS = frozenset({INVALID_SPEC, APPLY_FAILED, PROGRESS_DEADLINE_EXCEEDED, *podstate.SEVERITY})
# Shown in status but not worth an Event: the StatefulSet controller catches up within a second.
QUIET_REASONS = frozenset({WAITING_FOR_STATEFULSET})

__all__ = ("Event", "Extras", "compute_status", "failed_status", "merge_patch", "rfc3339", "transitions_of")


@dataclass(frozen=True)
class Extras:
    """What the reconcile adds to the observation."""

    image: str | None = None
    image_default_for: str | None = None
    # Spec fields not in effect (status.ignoredFields), and sentences saying why (SpecApplied).
    ignored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # (reason, message) when the API server refused the children: the spec is not applied.
    failure: tuple[str, str] | None = None


@dataclass(frozen=True)
class Observed:
    """The counts and findings status is made of."""

    desired: int
    partition: int
    sts_current: bool
    revision: str
    current_revision: str
    views: list[podstate.PodView]

    @property
    def pods(self) -> int:
        """Live pods (terminating ones no longer count)."""
        return len(self.views)

    @property
    def ready(self) -> int:
        """Ready pods of any revision."""
        return sum(1 for v in self.views if v.ready)

    @property
    def updated(self) -> int:
        """Pods on the update revision."""
        return sum(1 for v in self.views if self.revision and v.revision == self.revision)

    @property
    def ready_updated(self) -> int:
        """Ready pods on the update revision."""
        return sum(1 for v in self.views if v.ready and self.revision and v.revision == self.revision)

    @property
    def lagging(self) -> list[podstate.PodView]:
        """Pods the rollout still has to replace (at or above the partition, not on the update revision)."""
        return [v for v in self.views if self.revision and v.revision != self.revision and v.ordinal >= self.partition]

    @property
    def held(self) -> int:
        """Pods kept on a previous revision by spec.rollout.partition."""
        return sum(1 for v in self.views if self.revision and v.revision != self.revision and v.ordinal < self.partition)


def observe(pool: Pool, sts: dict[str, Any] | None, pods: list[dict[str, Any]], now: datetime,
            probe_failing_after: float) -> Observed:
    """Summarise the StatefulSet and the live pods."""
    sts_status = (sts or {}).get("status") or {}
    generation = int(((sts or {}).get("metadata") or {}).get("generation") or 0)
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    views = sorted((podstate.view(p, now, probe_failing_after) for p in live), key=lambda v: (v.ordinal, v.name))
    return Observed(
        desired=pool.spec.replicas,
        partition=pool.spec.rollout.partition,
        sts_current=sts is not None and int(sts_status.get("observedGeneration") or 0) >= generation > 0,
        revision=str(sts_status.get("updateRevision") or ""),
        current_revision=str(sts_status.get("currentRevision") or ""),
        views=views,
    )


def _url(pool: Pool, view: podstate.PodView) -> str:
    return f"http://{names.pod_dns_name(view.name, pool.name, pool.namespace)}:{view.port or pool.spec.port}"


def endpoints(pool: Pool, obs: Observed) -> list[str]:
    """Ready pods for routers, never mixing revisions outside a canary (see the module docstring)."""
    ready = [v for v in obs.views if v.ready]
    current = [v for v in ready if v.revision == obs.revision]
    chosen = ready if obs.partition > 0 or not current else current
    return [_url(pool, v) for v in chosen]


def revisions(pool: Pool, obs: Observed) -> list[dict[str, Any]]:
    """Per revision: its pods, ready pods and their endpoints; the update revision first."""
    names_seen = sorted({v.revision for v in obs.views}, key=lambda r: (r != obs.revision, r))
    out = []
    for rev in names_seen:
        pods = [v for v in obs.views if v.revision == rev]
        out.append({
            "name": rev,
            "updated": bool(obs.revision) and rev == obs.revision,
            "replicas": len(pods),
            "readyReplicas": sum(1 for v in pods if v.ready),
            "endpoints": [_url(pool, v) for v in pods if v.ready],
        })
    return out


def progress(obs: Observed, startup_timeout: int) -> tuple[str, str] | None:
    """(reason, message) of the change under way, or None when converged."""
    if not obs.sts_current:
        return WAITING_FOR_STATEFULSET, "the StatefulSet controller has not yet observed the latest spec"
    if obs.lagging:
        held = f"; spec.rollout.partition={obs.partition} holds ordinals below it" if obs.partition else ""
        return ROLLING_UPDATE, f"{obs.updated}/{obs.desired} pods on revision {obs.revision}{held}"
    if obs.pods != obs.desired:
        return SCALING, f"{obs.pods} pods, {obs.desired} wanted"
    if obs.ready < obs.desired:
        return STARTING, (
            f"{obs.ready}/{obs.desired} pods ready; the others are loading the model "
            f"(startup budget spec.startupTimeoutSeconds={startup_timeout}s)"
        )
    return None


def degradation(obs: Observed) -> tuple[str, str] | None:
    """(reason, message) of the most severe pod problem, quoting the first pod that has it."""
    problems = [v for v in obs.views if v.problem]
    if not problems:
        return None
    rank = {reason: i for i, reason in enumerate(podstate.SEVERITY)}
    worst = min(problems, key=lambda v: (rank.get(v.problem or "", len(rank)), v.ordinal))
    count = sum(1 for v in problems if v.problem == worst.problem)
    return worst.problem or "", f"{count} of {obs.pods} pods; {worst.name}: {worst.detail}"


def last_progress(previous: dict[str, Any], obs: Observed, moving: bool, now: datetime) -> str | None:
    """When the change under way last made progress (a count or the revision moved); None when settled."""
    if not moving:
        return None
    marks = (obs.revision, obs.ready_updated, obs.updated, obs.pods)
    before = (previous.get("updateRevision"), previous.get("updatedReadyReplicas"),
              previous.get("updatedReplicas"), previous.get("replicas"))
    if previous.get("lastProgressTime") and marks == before:
        return str(previous["lastProgressTime"])
    return rfc3339(now)


def deadline_seconds(pool: Pool) -> int:
    """spec.rollout.progressDeadlineSeconds, else the startup budget plus 5 minutes to schedule and pull."""
    explicit = pool.spec.rollout.progress_deadline_seconds
    return explicit if explicit is not None else pool.spec.startup_timeout_seconds + 300


def spec_applied(extras: Extras, generation: int) -> dict[str, Any]:
    """SpecApplied: False when a field of the spec is not in effect, saying which and why."""
    if not extras.ignored:
        return condition(SPEC_APPLIED, True, "AsSpecified", "every field of the spec is in effect", generation)
    protected = any(path.startswith("spec.podTemplate") for path in extras.ignored)
    reason = PROTECTED_FIELD_OVERRIDE if protected else FEATURE_GATE_MISSING
    return condition(SPEC_APPLIED, False, reason, "; ".join(extras.notes), generation)


def _verdict(pool: Pool, obs: Observed, previous: dict[str, Any], now: datetime,
             extras: Extras) -> tuple[tuple[str, str], list[dict[str, Any]], str | None]:
    """(top reason and message, the Ready/Progressing/Degraded conditions, lastProgressTime)."""
    gen = pool.generation
    moving = progress(obs, pool.spec.startup_timeout_seconds)
    broken = degradation(obs)
    clock = last_progress(previous, obs, moving is not None, now)
    since = parse_time(clock)
    limit = deadline_seconds(pool)
    if moving is not None and since is not None and (now - since).total_seconds() > limit:
        moving = (PROGRESS_DEADLINE_EXCEEDED, f"no progress for over {limit}s: {moving[1]}")
        stalled = True
    else:
        stalled = False
    if extras.failure is not None:
        reason, message = extras.failure
        return extras.failure, [
            condition(READY, False, reason, message, gen),
            condition(PROGRESSING, False, reason, "fix the spec; the children keep running the last good one", gen),
            condition(DEGRADED, True, reason, message, gen),
        ], clock
    if moving is None:
        canary = obs.held > 0
        reason = CANARY if canary else ("ScaledToZero" if obs.desired == 0 else "AllReplicasReady")
        text = f"{obs.ready_updated}/{obs.desired} pods ready on revision {obs.revision}"
        if canary:
            text += f", {obs.held} held on the previous revision by spec.rollout.partition={obs.partition}"
        top = (CANARY if canary else ("ScaledToZero" if obs.desired == 0 else READY), text)
        ready = condition(READY, True, reason, text, gen)
    else:
        top = broken or moving
        ready = condition(READY, False, top[0], top[1], gen)
    progressing = condition(PROGRESSING, moving is not None and not stalled,
                            moving[0] if moving else (CANARY if obs.held else "Complete"),
                            moving[1] if moving else "the pool matches its spec", gen)
    degraded = condition(DEGRADED, broken is not None, broken[0] if broken else "AsExpected",
                         broken[1] if broken else "no pod reports a problem", gen)
    return top, [ready, progressing, degraded], clock


def compute_status(pool: Pool, sts: dict[str, Any] | None, pods: list[dict[str, Any]], now: datetime,
                   probe_failing_after: float, extras: Extras | None = None) -> dict[str, Any]:
    """The pool's whole status from its StatefulSet and pods."""
    extras = extras or Extras()
    obs = observe(pool, sts, pods, now, probe_failing_after)
    top, conditions, clock = _verdict(pool, obs, pool.status, now, extras)
    out: dict[str, Any] = {
        "observedGeneration": pool.generation,
        "replicas": obs.pods,
        "readyReplicas": obs.ready,
        "updatedReplicas": obs.updated,
        "updatedReadyReplicas": obs.ready_updated,
        "readyText": f"{obs.ready}/{obs.desired}",
        "gpusPerPod": pool.spec.gpus_per_pod,
        "selector": names.selector_string(pool.name),
        "endpoints": endpoints(pool, obs),
        "revisions": revisions(pool, obs),
        "updateRevision": obs.revision,
        "currentRevision": obs.current_revision,
    }
    if extras.image:
        out["image"] = extras.image
        if extras.image_default_for:
            out["imageDefaultFor"] = extras.image_default_for
    if clock is not None:
        out["lastProgressTime"] = clock
    if extras.ignored:
        out["ignoredFields"] = list(extras.ignored)
    conditions.append(spec_applied(extras, pool.generation))
    out.update(reason=top[0], message=top[1], conditions=stamp(conditions, pool.status, now))
    return out


def failed_status(previous: dict[str, Any], generation: int, reason: str, message: str, now: datetime) -> dict[str, Any]:
    """Status of a pool whose spec cannot even be parsed (InvalidSpec).

    Counts and endpoints stay as last observed: the children keep running the last good spec.
    """
    conditions = [
        condition(READY, False, reason, message, generation),
        condition(PROGRESSING, False, reason, "fix the spec; nothing is applied until then", generation),
        condition(DEGRADED, True, reason, message, generation),
    ]
    kept = [c for c in previous.get("conditions") or [] if c.get("type") == SPEC_APPLIED]
    return {
        **previous,
        "observedGeneration": generation,
        "reason": reason,
        "message": message,
        "conditions": stamp(conditions, previous, now) + kept,
    }


def transitions_of(previous: dict[str, Any], new: dict[str, Any]) -> list[Event]:
    """Events for a change of the pool's top-level reason."""
    return transitions(previous, new, WARNING_REASONS, QUIET_REASONS)
