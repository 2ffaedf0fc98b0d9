"""Pod status as the kubelet reports it, built from what the harness observed (pure functions).

The harness keeps a ``ContainerView`` per container and a ``ConditionClock`` per pod; this module
turns them into the body of a strategic-merge PATCH on ``pods/<name>/status``. Conditions merge by
type, so the scheduler's PodScheduled condition is left as it is.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any


def now_rfc3339() -> str:
    """The current UTC time in the API's timestamp format (seconds precision)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass
class ContainerView:
    """What the harness knows about one container."""

    name: str
    image: str = ""
    container_id: str = ""
    restart_count: int = 0
    state: dict[str, Any] = dataclasses.field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict[str, Any] = dataclasses.field(default_factory=dict)
    ready: bool = False
    started: bool = False

    def set_running(self, container_id: str) -> None:
        """The process has been started."""
        self.container_id = container_id
        self.state = {"running": {"startedAt": now_rfc3339()}}
        self.ready = False
        self.started = False

    def set_terminated(self, exit_code: int, message: str = "", reason: str = "") -> dict[str, Any]:
        """The process exited; returns the terminated state (also used as lastState on restart)."""
        started = self.state.get("running", {}).get("startedAt", now_rfc3339())
        terminated = {
            "exitCode": exit_code,
            "reason": reason or ("Completed" if exit_code == 0 else "Error"),
            "startedAt": started,
            "finishedAt": now_rfc3339(),
            "containerID": self.container_id,
        }
        if message:
            terminated["message"] = message[-1024:]
        self.state = {"terminated": terminated}
        self.ready = False
        self.started = False
        return terminated

    def set_waiting(self, reason: str, message: str = "") -> None:
        """Not running: ContainerCreating, CrashLoopBackOff, CreateContainerConfigError, ..."""
        self.state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        self.ready = False
        self.started = False

    def to_status(self) -> dict[str, Any]:
        """One entry of status.containerStatuses."""
        status: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.container_id:
            status["containerID"] = self.container_id
        return status


class ConditionClock:
    """Pod conditions whose lastTransitionTime only moves when the status flips."""

    def __init__(self) -> None:
        self._conditions: dict[str, dict[str, Any]] = {}

    def set(self, kind: str, ok: bool, reason: str = "", message: str = "") -> None:
        """Record a condition; keep its transition time if the status did not change."""
        status = "True" if ok else "False"
        previous = self._conditions.get(kind)
        changed = previous is None or previous["status"] != status
        condition: dict[str, Any] = {
            "type": kind,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": now_rfc3339() if changed else previous["lastTransitionTime"],
        }
        if reason and not ok:
            condition["reason"] = reason
        if message and not ok:
            condition["message"] = message
        self._conditions[kind] = condition

    def to_list(self) -> list[dict[str, Any]]:
        """Conditions in a stable order."""
        return [self._conditions[k] for k in sorted(self._conditions)]


def pod_status_patch(
    phase: str,
    pod_ip: str,
    host_ip: str,
    start_time: str,
    containers: list[ContainerView],
    init_containers: list[ContainerView],
    clock: ConditionClock,
) -> dict[str, Any]:
    """The status PATCH body; also updates ``clock`` from the container views."""
    initialized = all("terminated" in c.state and c.state["terminated"]["exitCode"] == 0 for c in init_containers)
    ready = initialized and phase == "Running" and all(c.ready for c in containers)
    not_ready = [c.name for c in containers if not c.ready]
    message = f"containers with unready status: [{' '.join(not_ready)}]" if not_ready else ""
    clock.set("PodReadyToStartContainers", True)
    clock.set("Initialized", initialized, "ContainersNotInitialized", "init containers have not completed")
    clock.set("ContainersReady", ready, "ContainersNotReady", message)
    clock.set("Ready", ready, "ContainersNotReady", message)
    return {
        "status": {
            "phase": phase,
            "hostIP": host_ip,
            "hostIPs": [{"ip": host_ip}],
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": start_time,
            "conditions": clock.to_list(),
            "containerStatuses": [c.to_status() for c in containers],
            "initContainerStatuses": [c.to_status() for c in init_containers],
        }
    }
