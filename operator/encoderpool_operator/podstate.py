"""What is wrong with one encoder pod, read from its status (a pure function).

Rules, most specific first; the first that matches names the pod's problem:

1. ``Unschedulable``: condition PodScheduled=False with reason Unschedulable. The scheduler's own
   message is quoted ("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.").
2. ``ImagePullFailed``: the encoder container waits in ErrImagePull/ImagePullBackOff/InvalidImageName.
3. ``ModelLoadFailed``: the container's current or last termination says the model did not load:
   exit code 3 (encoder-pod's exit code for a model that cannot be loaded), or a termination
   message (the log tail: terminationMessagePolicy FallbackToLogsOnError) that mentions the
   model path, config.json, or "model load". Evidence, not a guess from timing: a pod that is
   merely slow to load is "Starting" until its startup budget runs out, and then the kubelet's
   restarts make it CrashLoop with the log tail quoted.
4. ``ContainerConfigError``: the container cannot be created (a missing Secret or ConfigMap in
   spec.env, say).
5. ``CrashLoop``: the container waits in CrashLoopBackOff for any other reason.
6. ``ProbeFailing``: the container passed its startup probe (the model loaded and encoded once),
   but has not been ready for ``probe_failing_after`` seconds since it started or last turned
   unready: the real encode behind GET /health keeps failing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from encoderpool_operator import names

UNSCHEDULABLE = "Unschedulable"
IMAGE_PULL_FAILED = "ImagePullFailed"
MODEL_LOAD_FAILED = "ModelLoadFailed"
CONTAINER_CONFIG_ERROR = "ContainerConfigError"
CRASH_LOOP = "CrashLoop"
PROBE_FAILING = "ProbeFailing"
# Most severe first: the pool reports the most severe problem any of its pods has.
SEVERITY = (UNSCHEDULABLE, IMAGE_PULL_FAILED, MODEL_LOAD_FAILED, CONTAINER_CONFIG_ERROR, CRASH_LOOP, PROBE_FAILING)

MODEL_LOAD_EXIT_CODE = 3
"""Mirrors encoder_pod.exitcodes.ExitCode.MODEL_LOAD_FAILED (the operator may not import the pod;
tests/unit/encoder/test_exitcodes.py pins the two equal)."""
MODEL_LOAD_MESSAGE = re.compile(r"model[ _-]?load|load(ing)? (the )?model|MODEL_PATH|model-path|config\.json", re.I)
IMAGE_PULL_REASONS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName"}
CONFIG_REASONS = {"CreateContainerConfigError", "CreateContainerError"}
MAX_DETAIL = 512  # a quoted message longer than this is cut: status is read by people
POD_VERDICT_PREFIX = "encoder-pod: "
"""How the pod's CLI starts the line it prints last when it exits on an error (encoder_pod.cli)."""


@dataclass(frozen=True)
class PodView:
    """The facts about one pod that the pool status needs."""

    name: str
    ordinal: int
    revision: str
    ready: bool
    problem: str | None = None
    detail: str = ""
    port: int | None = None  # the encoder's containerPort: mid-rollout, old and new pods may differ


def parse_time(value: str | None) -> datetime | None:
    """An RFC 3339 timestamp from the API server, or None."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(timezone.utc)


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 3] + "..."


def condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    """A pod condition by type ({} when absent)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def encoder_status(pod: dict[str, Any]) -> dict[str, Any]:
    """The encoder container's status ({} before the kubelet reports one)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == names.CONTAINER_NAME:
            return dict(status)
    return {}


def is_ready(pod: dict[str, Any]) -> bool:
    """Ready and not on its way out (a terminating pod no longer takes new requests)."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return condition(pod, "Ready").get("status") == "True"


def _ordinal(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def _termination_problem(status: dict[str, Any]) -> str | None:
    """ModelLoadFailed detail from the current or last termination, if it is one."""
    for term in ((status.get("state") or {}).get("terminated"), (status.get("lastState") or {}).get("terminated")):
        # An OOM kill is no model problem, whatever the log tail the kubelet quotes says (it is the
        # server's own start-up log, which names the model path): it is reported as CrashLoop, with
        # the memory hint.
        if not term or term.get("reason") == "OOMKilled":
            continue
        message = str(term.get("message") or "")
        if term.get("exitCode") == MODEL_LOAD_EXIT_CODE or MODEL_LOAD_MESSAGE.search(message):
            return _short(f"exit code {term.get('exitCode')}: {_verdict(message) or term.get('reason', '')}")
    return None


def _verdict(message: str) -> str:
    """The pod's own last word in a quoted log tail: its last ``encoder-pod:`` line, else the tail.

    A pod that served before it failed (a load that refused the checkpoint) leaves a tail of its
    start-up log; cut to :data:`MAX_DETAIL` from the start, the reason printed last would be lost.
    """
    lines = [line.strip() for line in message.splitlines()]
    verdicts = [line for line in lines if line.startswith(POD_VERDICT_PREFIX)]
    return verdicts[-1] if verdicts else message


def _crash_detail(status: dict[str, Any]) -> str:
    last = (status.get("lastState") or {}).get("terminated") or {}
    hint = "; raise spec.resources.limits.memory" if last.get("reason") == "OOMKilled" else ""
    return _short(
        f"restarted {status.get('restartCount', 0)} times, last exit code {last.get('exitCode')} "
        f"({last.get('reason', 'unknown')}){hint}: {last.get('message', '')}".rstrip(": ")
    )


def _probe_problem(pod: dict[str, Any], status: dict[str, Any], now: datetime, after: float) -> str | None:
    running = (status.get("state") or {}).get("running")
    if not running or not status.get("started") or status.get("ready"):
        return None
    since = [t for t in (parse_time(running.get("startedAt")), parse_time(condition(pod, "Ready").get("lastTransitionTime"))) if t]
    if not since:
        return None
    unready = (now - max(since)).total_seconds()
    if unready < after:
        return None
    # The threshold, not the elapsed time: a message that changes every resync would rewrite status.
    return f"not ready for over {int(after)}s after the model loaded: GET /health (a recent real encode) keeps failing"


def diagnose(pod: dict[str, Any], now: datetime, probe_failing_after: float) -> tuple[str, str] | None:
    """(reason, detail) of the pod's problem, or None; see the module docstring for the rules."""
    if is_ready(pod):
        # lastState keeps an old termination forever; a pod that serves now has recovered.
        return None
    scheduled = condition(pod, "PodScheduled")
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return UNSCHEDULABLE, _short(scheduled.get("message") or "no node fits the pod")
    status = encoder_status(pod)
    waiting = (status.get("state") or {}).get("waiting") or {}
    if waiting.get("reason") in IMAGE_PULL_REASONS:
        return IMAGE_PULL_FAILED, _short(f"{waiting['reason']}: {waiting.get('message', '')}")
    model = _termination_problem(status)
    if model is not None:
        return MODEL_LOAD_FAILED, model
    if waiting.get("reason") in CONFIG_REASONS:
        return CONTAINER_CONFIG_ERROR, _short(f"{waiting['reason']}: {waiting.get('message', '')}")
    if waiting.get("reason") == "CrashLoopBackOff":
        return CRASH_LOOP, _crash_detail(status)
    probe = _probe_problem(pod, status, now, probe_failing_after)
    if probe is not None:
        return PROBE_FAILING, probe
    return None


def encoder_port(pod: dict[str, Any]) -> int | None:
    """The encoder container's port named http, as this pod declares it."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") != names.CONTAINER_NAME:
            continue
        for port in container.get("ports") or []:
            if port.get("name") == names.PORT_NAME and port.get("containerPort"):
                return int(port["containerPort"])
    return None


def view(pod: dict[str, Any], now: datetime, probe_failing_after: float) -> PodView:
    """Summarise one pod."""
    meta = pod.get("metadata") or {}
    name = str(meta.get("name", ""))
    found = diagnose(pod, now, probe_failing_after)
    return PodView(
        name=name,
        ordinal=_ordinal(name),
        revision=str((meta.get("labels") or {}).get(names.REVISION_LABEL, "")),
        ready=is_ready(pod),
        problem=found[0] if found else None,
        detail=found[1] if found else "",
        port=encoder_port(pod),
    )


def compact(pod: dict[str, Any]) -> dict[str, Any]:
    """The parts of a pod that status needs, for a watch cache that holds many pods."""
    meta = pod.get("metadata") or {}
    containers = [{"name": c.get("name"), "ports": c.get("ports") or []}
                  for c in (pod.get("spec") or {}).get("containers") or []]
    keep = ("name", "namespace", "uid", "labels", "deletionTimestamp", "resourceVersion")
    return {
        "metadata": {k: meta[k] for k in keep if k in meta},
        "spec": {"containers": containers, "nodeName": (pod.get("spec") or {}).get("nodeName")},
        "status": pod.get("status") or {},
    }
