"""Small readers and waits over API objects, for the e2e and kind tests and the operator benchmark."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .api import ApiClient, path_for, wait_for


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The status condition of type ``kind``, or None."""
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return None


def is_true(obj: dict[str, Any], kind: str) -> bool:
    """True when condition ``kind`` has status "True"."""
    cond = condition(obj, kind)
    return cond is not None and cond.get("status") == "True"


def pod_ready(pod: dict[str, Any]) -> bool:
    """Running with the Ready condition True."""
    return pod.get("status", {}).get("phase") == "Running" and is_true(pod, "Ready")


def wait_for_pod(api: ApiClient, namespace: str, name: str, predicate: Callable[[dict[str, Any]], Any],
                 timeout: float, what: str) -> dict[str, Any]:
    """Poll the pod until ``predicate(pod)`` is truthy; return the pod. The timeout error shows
    the pod's last status, which is what one needs to see when a wait fails."""
    path = path_for("v1", "pods", namespace, name)
    last: dict[str, Any] = {}

    def check() -> dict[str, Any] | None:
        last.clear()
        last.update(api.get(path))
        return last if predicate(last) else None

    try:
        return wait_for(check, timeout, f"pod {namespace}/{name} {what}")
    except TimeoutError as err:
        raise TimeoutError(f"{err}; last status: {last.get('status')}") from err


def wait_gone(api: ApiClient, path: str, timeout: float) -> None:
    """Wait until GET ``path`` answers 404."""
    wait_for(lambda: api.get_or_none(path) is None, timeout, f"{path} to be deleted")


def crd_established(crd: dict[str, Any] | None) -> bool:
    """True once the API server serves the CRD (Established and NamesAccepted)."""
    conditions = {c["type"]: c["status"] for c in ((crd or {}).get("status") or {}).get("conditions") or []}
    return conditions.get("Established") == "True" and conditions.get("NamesAccepted") == "True"
