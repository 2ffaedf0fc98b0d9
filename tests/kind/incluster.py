"""Requests sent from inside the kind cluster, as a user's router or client pod sends them.

``ClientPod`` is a pod of the encoder image (it has python and httpx) that sleeps; tests run the
scripts of tests/kind/scripts/ in it with ``kubectl exec`` (mounted from a ConfigMap), so every
request goes through the cluster's DNS (CoreDNS) to pod IPs, and through ClusterIPs where a
Service has one. The pod passes the ``restricted`` Pod Security Standard, so it runs in any test
namespace. ``run_to_completion`` runs one script in a pod of its own (with volumes of the test's,
e.g. a claim mounted as another workload mounts it) and reads its answer from the pod's log.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from testkit.cluster.api import ApiError, path_for, wait_for
from testkit.cluster.objects import pod_ready, wait_for_pod
from tests.e2e.pools import Pools
from tests.kind.images import ENCODER_CPU_IMAGE

SCRIPTS = Path(__file__).with_name("scripts")
SCRIPTS_CONFIGMAP = "kind-test-scripts"
MOUNT = "/scripts"
READY_SECONDS = 120.0
UID = 10001  # the numeric USER of docker/Dockerfile.encoder-pod, the pools' pods' uid
RESTRICTED = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn", "audit")}


def scripts_configmap(pools: Pools) -> None:
    """The scripts of tests/kind/scripts/ as a ConfigMap of the namespace (once)."""
    if pools.api.get_or_none(path_for("v1", "configmaps", pools.namespace, SCRIPTS_CONFIGMAP)) is not None:
        return
    data = {p.name: p.read_text() for p in sorted(SCRIPTS.glob("*.py"))}
    pools.api.create(path_for("v1", "configmaps", pools.namespace),
                     {"metadata": {"name": SCRIPTS_CONFIGMAP}, "data": data})


def restricted_security() -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod, container) securityContext that the restricted Pod Security Standard admits."""
    pod = {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}
    return pod, container


def refuses_a_bare_pod(pools: Pools, timeout: float = 30.0) -> None:
    """Wait until PodSecurity refuses a pod without any securityContext in the namespace: the
    ``restricted`` standard is enforced there (its admission reads the namespace's labels from a cache)."""
    bare = {"metadata": {"generateName": "bare-"}, "spec": {"containers": [{"name": "c", "image": ENCODER_CPU_IMAGE}]}}

    def refused() -> bool:
        try:
            admitted = pools.api.create(path_for("v1", "pods", pools.namespace), bare)
        except ApiError as err:
            assert err.status_code == 403 and 'violates PodSecurity "restricted' in err.message, err.message
            return True
        pools.api.delete(path_for("v1", "pods", pools.namespace, admitted["metadata"]["name"]), grace_period_seconds=0)
        return False

    wait_for(refused, timeout, f"PodSecurity to refuse a bare pod in {pools.namespace}", interval=1.0)


def script_pod(name: str, command: list[str], restart: str = "Never", volumes: list[dict[str, Any]] | None = None,
               mounts: list[dict[str, Any]] | None = None, memory: str = "512Mi") -> dict[str, Any]:
    """A pod of the encoder image running ``command`` with the scripts mounted at /scripts (and
    ``volumes`` mounted as ``mounts`` say; ``memory`` is its limit)."""
    pod_security, container_security = restricted_security()
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "restartPolicy": restart, "securityContext": pod_security, "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "client", "image": ENCODER_CPU_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": command, "securityContext": container_security,
                "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
                "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": memory}},
                "volumeMounts": [{"name": "scripts", "mountPath": MOUNT, "readOnly": True},
                                 {"name": "tmp", "mountPath": "/tmp"}, *(mounts or [])],
            }],
            "volumes": [{"name": "scripts", "configMap": {"name": SCRIPTS_CONFIGMAP}},
                        {"name": "tmp", "emptyDir": {}}, *(volumes or [])],
        },
    }


def run_to_completion(pools: Pools, pod: dict[str, Any], timeout: float = 300.0) -> Any:
    """Create ``pod`` (a :func:`script_pod` that ends), wait for it to end and delete it; the last
    line of its log is JSON. A pod that did not succeed fails the test with its log."""
    name = pod["metadata"]["name"]
    scripts_configmap(pools)
    pools.api.create(path_for("v1", "pods", pools.namespace), pod)
    try:
        ended = wait_for_pod(pools.api, pools.namespace, name,
                             lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), timeout, "to finish")
        log = pools.kubectl("logs", name, check=False)
        assert ended["status"]["phase"] == "Succeeded", \
            f"pod {name} {ended['status']['phase']}: {ended['status'].get('containerStatuses')}\n{log.stdout[-3000:]}{log.stderr[-1000:]}"
        return json.loads(log.stdout.strip().splitlines()[-1])
    finally:
        pools.api.delete(path_for("v1", "pods", pools.namespace, name), grace_period_seconds=0)


class ClientPod:
    """``with ClientPod(pools) as pod: pod.run("encode.py", url)`` -> the script's JSON answer."""

    def __init__(self, pools: Pools) -> None:
        self.pools = pools
        self.name = f"client-{uuid.uuid4().hex[:6]}"

    def __enter__(self) -> ClientPod:
        self.pools.api.create(path_for("v1", "pods", self.pools.namespace),
                              script_pod(self.name, ["python", "-c", "import time; time.sleep(1e9)"], "Always"))
        wait_for_pod(self.pools.api, self.pools.namespace, self.name, pod_ready, READY_SECONDS, "Ready")
        return self

    def __exit__(self, *exc: object) -> None:
        self.pools.api.delete(path_for("v1", "pods", self.pools.namespace, self.name), grace_period_seconds=0)

    def run(self, script: str, *args: str, timeout: float = 300) -> Any:
        """Run a script of tests/kind/scripts/ in the pod; its last stdout line is JSON."""
        done = self.pools.kubectl("exec", self.name, "--", "python", f"{MOUNT}/{script}", *args, timeout=timeout)
        return json.loads(done.stdout.strip().splitlines()[-1])


class LoadPod:
    """tests/kind/scripts/load.py in a pod of its own: ``with LoadPod(pools, host, port) as load:``
    keeps requests flowing to the Service name meanwhile; ``load.tally`` is its count at exit."""

    def __init__(self, pools: Pools, host: str, port: int, workers: int = 6, items: int = 4) -> None:
        self.pools = pools
        self.name = f"load-{uuid.uuid4().hex[:6]}"
        self.command = ["python", f"{MOUNT}/load.py", host, str(port), str(workers), str(items)]
        self.tally: dict[str, Any] = {}

    def __enter__(self) -> LoadPod:
        self.pools.api.create(path_for("v1", "pods", self.pools.namespace), script_pod(self.name, self.command))
        wait_for_pod(self.pools.api, self.pools.namespace, self.name, pod_ready, READY_SECONDS, "Ready")
        wait_for(lambda: '"started"' in self.pools.kubectl("logs", self.name).stdout, 60, "the load to start")
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.pools.kubectl("exec", self.name, "--", "touch", "/tmp/stop")
            wait_for_pod(self.pools.api, self.pools.namespace, self.name,
                         lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), 180, "to finish")
            last = self.pools.kubectl("logs", self.name).stdout.strip().splitlines()[-1]
            self.tally = json.loads(last)
        finally:
            self.pools.api.delete(path_for("v1", "pods", self.pools.namespace, self.name), grace_period_seconds=0)

    def line(self) -> str:
        """The numbers, for the test output."""
        t = self.tally
        return (f"{t.get('sent')} requests: {t.get('ok')} answered 200 at once, {t.get('refused_draining')} refused "
                f"by a draining pod (503 + Retry-After), {t.get('retried_ok')} of them answered on retry; "
                f"lost: {t.get('lost')}; per pod IP {t.get('by_address')}")
