"""EncoderPools in a namespace of their own: apply, read, wait, and say why when a wait fails.

A failed wait quotes what a person would look at next: the pool's status, its pods' phases and
conditions, and the tail of the operator's log.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from testkit.cluster.api import ApiClient, path_for, wait_for
from testkit.cluster.objects import is_true

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
INVALID_POOLS = REPO / "tests" / "unit" / "operator" / "data" / "invalid-pools.yaml"
API_VERSION = "encoderpool.io/v1alpha1"
POOL_LABEL = "encoderpool.io/pool"
GPU_RESOURCE = "nvidia.com/gpu"
# kind -> (apiVersion, plural) of a pool's children.
CHILDREN = {
    "StatefulSet": ("apps/v1", "statefulsets"),
    "Service": ("v1", "services"),
    "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets"),
}
NAMESPACE_CLEANUP_SECONDS = 120.0


def load_example(name: str) -> dict[str, Any]:
    """An example pool from examples/ as a dict (to adapt before applying)."""
    return yaml.safe_load((EXAMPLES / name).read_text())


def cpu_pool(name: str, **spec: Any) -> dict[str, Any]:
    """examples/encoderpool-cpu.yaml (the image's baked tiny checkpoint) named ``name``, with one
    worker process and ``spec`` set over the example's."""
    manifest = load_example("encoderpool-cpu.yaml")
    manifest["metadata"]["name"] = name
    manifest["spec"].update(parallelism={"tensor": 1, "data": 1}, **spec)
    return manifest


def pool_path(namespace: str, name: str | None = None) -> str:
    """REST path of a namespace's pools or one pool."""
    return path_for(API_VERSION, "encoderpools", namespace, name)


def pool_ready(pool: dict[str, Any]) -> bool:
    """What ``kubectl get encpool`` shows as REASON Ready, for the current generation."""
    status = pool.get("status") or {}
    return (status.get("reason") == "Ready" and is_true(pool, "Ready")
            and status.get("observedGeneration") == pool["metadata"]["generation"])


def pool_reason(reason: str) -> Callable[[dict[str, Any]], bool]:
    """Predicate: the pool's top-level reason is ``reason`` for its current generation."""
    def check(pool: dict[str, Any]) -> bool:
        status = pool.get("status") or {}
        return status.get("reason") == reason and status.get("observedGeneration") == pool["metadata"]["generation"]
    return check


def owner_uids(obj: dict[str, Any]) -> list[str]:
    """UIDs of the object's controlling owners."""
    return [ref["uid"] for ref in obj["metadata"].get("ownerReferences") or [] if ref.get("controller")]


def summarize_pod(pod: dict[str, Any]) -> str:
    """One line: name, phase, node, conditions and the container's state."""
    status = pod.get("status") or {}
    conditions = ",".join(f"{c['type']}={c['status']}" for c in status.get("conditions") or [])
    containers = [{k: c.get(k) for k in ("state", "lastState", "restartCount", "ready", "started")}
                  for c in status.get("containerStatuses") or []]
    return (f"{pod['metadata']['name']} {status.get('phase')} on {pod['spec'].get('nodeName')} [{conditions}] "
            f"{json.dumps(containers)[:600]}")


class Pools:
    """The pools of one namespace, read with the admin identity (the tests' point of view)."""

    def __init__(self, cluster: Any, namespace: str, operator: Any = None) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.operator = operator
        self.api: ApiClient = cluster.api()

    def close(self) -> None:
        """Release the REST client."""
        self.api.close()

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """kubectl in this namespace."""
        return self.cluster.kubectl("-n", self.namespace, *args, **kwargs)

    def apply(self, source: Path | Mapping[str, Any], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """``kubectl apply`` a file as it is, or a manifest dict, into this namespace."""
        if isinstance(source, Path):
            return self.kubectl("apply", "-f", str(source), **kwargs)
        return self.kubectl("apply", "-f", "-", input=yaml.safe_dump(dict(source)), **kwargs)

    def get(self, name: str) -> dict[str, Any]:
        """The pool."""
        return self.api.get(pool_path(self.namespace, name))

    def pods(self, name: str) -> list[dict[str, Any]]:
        """The pool's pods (by the pool's selector label), sorted by name."""
        items = self.api.get(path_for("v1", "pods", self.namespace), labelSelector=f"{POOL_LABEL}={name}")["items"]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    def children(self, name: str) -> dict[str, list[dict[str, Any]]]:
        """Every StatefulSet, Service and PodDisruptionBudget carrying the pool's label."""
        return {kind: self.api.get(path_for(version, plural, self.namespace),
                                   labelSelector=f"{POOL_LABEL}={name}")["items"]
                for kind, (version, plural) in CHILDREN.items()}

    def child(self, kind: str, name: str) -> dict[str, Any] | None:
        """One child by kind and name (children are named after their pool), or None."""
        version, plural = CHILDREN[kind]
        return self.api.get_or_none(path_for(version, plural, self.namespace, name))

    def events(self, name: str) -> list[dict[str, Any]]:
        """Events about the pool (what ``kubectl describe encpool`` lists)."""
        return self.api.get(path_for("v1", "events", self.namespace),
                            fieldSelector=f"involvedObject.kind=EncoderPool,involvedObject.name={name}")["items"]

    def ready_addresses(self, service: str) -> list[tuple[str, str, int]]:
        """(address, pod name, port) of every ready endpoint in the Service's EndpointSlices."""
        slices = self.api.get(path_for("discovery.k8s.io/v1", "endpointslices", self.namespace),
                              labelSelector=f"kubernetes.io/service-name={service}")["items"]
        out = []
        for item in slices:
            port = next(p["port"] for p in item.get("ports") or [] if p.get("name") == "http")
            for endpoint in item.get("endpoints") or []:
                if endpoint.get("conditions", {}).get("ready"):
                    out.extend((a, endpoint["targetRef"]["name"], port) for a in endpoint["addresses"])
        return out

    def diagnose(self, name: str) -> str:
        """The pool's status, its pods and the operator's log tail, for a failure message."""
        pool = self.api.get_or_none(pool_path(self.namespace, name))
        lines = [f"pool {self.namespace}/{name} status: {json.dumps((pool or {}).get('status'), indent=1)}"]
        lines += ["pod " + summarize_pod(p) for p in self.pods(name)]
        if self.operator is not None:
            lines.append("--- operator log tail ---\n" + self.operator.log_tail(25))
        return "\n".join(lines)

    def wait(self, name: str, predicate: Callable[[dict[str, Any]], Any], timeout: float, what: str,
             seen: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Poll the pool until ``predicate(pool)``; return it. ``seen`` collects every status read."""
        def check() -> dict[str, Any] | None:
            pool = self.get(name)
            if seen is not None:
                seen.append(pool)
            return pool if predicate(pool) else None

        try:
            return wait_for(check, timeout, f"pool {self.namespace}/{name} {what}")
        except TimeoutError as err:
            raise AssertionError(f"{err}\n{self.diagnose(name)}") from None


@contextlib.contextmanager
def pool_namespace(cluster: Any, operator: Any = None, labels: Mapping[str, str] | None = None,
                   prefix: str = "e2e-pool") -> Iterator[Pools]:
    """A fresh namespace for pools; on exit it is deleted, and its pods are waited out so that the
    next test finds the fake GPUs free again."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(name, labels)
    pools = Pools(cluster, name, operator)
    try:
        yield pools
    finally:
        try:
            delete_namespace(pools.api, name)
        finally:
            pools.close()


def delete_namespace(api: ApiClient, name: str) -> None:
    """Delete a namespace and wait until none of its pods is left.

    The pools, their StatefulSets and the pods are deleted first, directly: the namespace
    controller alone takes about 5 s to get to the pods.
    """
    for path, options in ((pool_path(name), None),
                          (path_for("apps/v1", "statefulsets", name), {"propagationPolicy": "Background"}),
                          (path_for("v1", "pods", name), None)):
        api.request("DELETE", path, options)  # deletecollection
    api.delete(path_for("v1", "namespaces", name=name))
    wait_for(lambda: not api.get(path_for("v1", "pods", name))["items"], NAMESPACE_CLEANUP_SECONDS,
             f"the pods of namespace {name} to be deleted")
