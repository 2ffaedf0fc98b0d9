"""The local node runs pods for real: command + env as a host process on its own loopback IP,
the pod's readiness probe decides Ready, exits show up as the kubelet would report them."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.cluster import LOCAL_NODE_NAME, Cluster, local_node_placement
from tests.e2e.cluster.api import path_for, wait_for
from tests.e2e.cluster.objects import condition, pod_ready, wait_for_pod, wait_gone
from tests.e2e.cluster.procs import pid_alive

pytestmark = pytest.mark.e2e


def local_pod(name: str, command: list[str], **container: Any) -> dict[str, Any]:
    """A pod pinned to the local node running ``command``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            **local_node_placement(),
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": "local", "command": command, **container}],
        },
    }


def http_server_pod(name: str) -> dict[str, Any]:
    """python's http.server on the wildcard address, with a readiness probe and env from fieldRefs."""
    return local_pod(
        name,
        [sys.executable, "-m", "http.server", "--bind", "0.0.0.0", "$(PORT)"],
        ports=[{"name": "http", "containerPort": 8080}],
        env=[
            {"name": "PORT", "value": "8080"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        readinessProbe={"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1, "failureThreshold": 2},
    )


def container_pid(pod: dict[str, Any]) -> int:
    """The local node reports containerID local://PID."""
    return int(pod["status"]["containerStatuses"][0]["containerID"].removeprefix("local://"))


def test_local_node_is_ready_without_gpus(k8s_cluster: Cluster) -> None:
    with k8s_cluster.api() as api:
        node = api.get(path_for("v1", "nodes", name=LOCAL_NODE_NAME))
        lease = api.get(path_for("coordination.k8s.io/v1", "leases", "kube-node-lease", LOCAL_NODE_NAME))
    assert condition(node, "Ready")["status"] == "True"
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    assert lease["spec"]["holderIdentity"] == LOCAL_NODE_NAME


def test_http_server_pod_becomes_ready_and_answers_on_its_pod_ip(k8s_cluster: Cluster, namespace: str) -> None:
    with k8s_cluster.api() as api:
        api.create(path_for("v1", "pods", namespace), http_server_pod("web"))
        pod = wait_for_pod(api, namespace, "web", pod_ready, 30, "Ready")
        ip = pod["status"]["podIP"]
        assert pod["spec"]["nodeName"] == LOCAL_NODE_NAME
        assert ip.startswith(k8s_cluster.local_node.network.prefix + ".")
        assert httpx.get(f"http://{ip}:8080/", timeout=5).status_code == 200
        status = pod["status"]["containerStatuses"][0]
        assert status["ready"] is True and "running" in status["state"]
        pid = container_pid(pod)
        assert pid_alive(pid)
        # The env was resolved like a kubelet's: fieldRefs and the pod IP are visible to the process.
        raw = Path(f"/proc/{pid}/environ").read_text()
        environ = dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)
        assert environ["POD_NAME"] == "web" and environ["POD_IP"] == ip

        api.delete(path_for("v1", "pods", namespace, "web"))
        wait_gone(api, path_for("v1", "pods", namespace, "web"), 20)
    assert not pid_alive(pid)


def test_two_pods_on_the_same_port_get_distinct_ips(k8s_cluster: Cluster, namespace: str) -> None:
    with k8s_cluster.api() as api:
        for name in ("web-a", "web-b"):
            api.create(path_for("v1", "pods", namespace), http_server_pod(name))
        ips = {wait_for_pod(api, namespace, n, pod_ready, 30, "Ready")["status"]["podIP"] for n in ("web-a", "web-b")}
    assert len(ips) == 2
    for ip in ips:
        assert httpx.get(f"http://{ip}:8080/", timeout=5).status_code == 200


def test_failing_readiness_probe_keeps_the_pod_not_ready(k8s_cluster: Cluster, namespace: str) -> None:
    pod = http_server_pod("not-ready")
    pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] = "/missing"
    with k8s_cluster.api() as api:
        api.create(path_for("v1", "pods", namespace), pod)
        pod = wait_for_pod(api, namespace, "not-ready",
                           lambda p: p["status"].get("phase") == "Running" and condition(p, "Ready"), 30, "Running")
        # Two 1 s periods of 404s have passed by now: still Ready=False, the process still running.
        wait_for(lambda: httpx.get(f"http://{pod['status']['podIP']}:8080/", timeout=2).status_code == 200, 10,
                 "the server to answer")
        pod = api.get(path_for("v1", "pods", namespace, "not-ready"))
    assert condition(pod, "Ready")["status"] == "False"
    assert pod["status"]["containerStatuses"][0]["ready"] is False


def test_exiting_container_crash_loops_with_restart_count(k8s_cluster: Cluster, namespace: str) -> None:
    with k8s_cluster.api() as api:
        api.create(path_for("v1", "pods", namespace),
                   local_pod("crasher", [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]))
        # (A pod starting up waits in ContainerCreating for a moment: the back-off is the state to wait for.)
        pod = wait_for_pod(api, namespace, "crasher",
                           lambda p: (p["status"].get("containerStatuses") or [{}])[0].get("state", {})
                           .get("waiting", {}).get("reason") == "CrashLoopBackOff", 30, "in back-off")
    status = pod["status"]["containerStatuses"][0]
    assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert status["restartCount"] >= 1
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert "boom" in status["lastState"]["terminated"]["message"]
    assert condition(pod, "Ready")["status"] == "False"


def test_exiting_container_with_restart_never_fails_the_pod(k8s_cluster: Cluster, namespace: str) -> None:
    pod = local_pod("one-shot", [sys.executable, "-c", "raise SystemExit(7)"])
    pod["spec"]["restartPolicy"] = "Never"
    with k8s_cluster.api() as api:
        api.create(path_for("v1", "pods", namespace), pod)
        pod = wait_for_pod(api, namespace, "one-shot", lambda p: p["status"].get("phase") == "Failed", 30, "Failed")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 7 and terminated["reason"] == "Error"


def test_pod_without_command_reports_a_config_error(k8s_cluster: Cluster, namespace: str) -> None:
    pod = local_pod("no-command", [])
    del pod["spec"]["containers"][0]["command"]
    with k8s_cluster.api() as api:
        api.create(path_for("v1", "pods", namespace), pod)
        pod = wait_for_pod(api, namespace, "no-command",
                           lambda p: "waiting" in (p["status"].get("containerStatuses") or [{}])[0].get("state", {})
                           and p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
                           != "ContainerCreating", 30, "to report why it cannot start")
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "CreateContainerConfigError"
    assert "no command" in waiting["message"]


def test_statefulset_on_the_local_node_fills_its_headless_service_endpointslice(
        k8s_cluster: Cluster, namespace: str) -> None:
    """The chain the operator relies on: StatefulSet -> Pods (run here, probed) -> Ready ->
    EndpointSlice of the headless Service -> an address that answers."""
    if not k8s_cluster.local_node.pod_ips_routable:
        pytest.skip("local pod IPs are loopback addresses here (no CAP_NET_ADMIN): the API server "
                    "refuses them in EndpointSlices; run as root (as CI does) for routed pod IPs")
    template = http_server_pod("web")
    statefulset = {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "serviceName": "web", "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": template["spec"]}},
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
               "spec": {"clusterIP": "None", "selector": {"app": "web"}, "ports": [{"name": "http", "port": 8080}]}}
    with k8s_cluster.api() as api:
        api.create(path_for("v1", "services", namespace), service)
        api.create(path_for("apps/v1", "statefulsets", namespace), statefulset)

        def ready_addresses() -> list[str]:
            slices = api.get(path_for("discovery.k8s.io/v1", "endpointslices", namespace),
                             labelSelector="kubernetes.io/service-name=web")["items"]
            addresses = [a for s in slices for e in s.get("endpoints") or []
                         if e.get("conditions", {}).get("ready") for a in e["addresses"]]
            return addresses if len(addresses) == 2 else []

        addresses = wait_for(ready_addresses, 60, "two ready endpoints")
        for address in addresses:
            assert httpx.get(f"http://{address}:8080/", timeout=5).status_code == 200
        pids = [container_pid(api.get(path_for("v1", "pods", namespace, f"web-{i}"))) for i in range(2)]
        # Deleting the StatefulSet lets the garbage collector delete its pods; the node kills them.
        api.request("DELETE", path_for("apps/v1", "statefulsets", namespace, "web"),
                    {"propagationPolicy": "Background"})
        for i in range(2):
            wait_gone(api, path_for("v1", "pods", namespace, f"web-{i}"), 30)
    assert not any(pid_alive(pid) for pid in pids)


def test_missing_command_binary_is_a_start_error_in_back_off(k8s_cluster: Cluster, namespace: str) -> None:
    with k8s_cluster.api() as api:
        api.create(path_for("v1", "pods", namespace), local_pod("no-binary", ["/nonexistent/encoder-pod", "serve"]))
        pod = wait_for_pod(api, namespace, "no-binary",
                           lambda p: (p["status"].get("containerStatuses") or [{}])[0].get("restartCount", 0) >= 1,
                           30, "in back-off")
    status = pod["status"]["containerStatuses"][0]
    assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert status["lastState"]["terminated"]["reason"] == "StartError"
    assert "No such file" in status["lastState"]["terminated"]["message"]


def test_failing_liveness_probe_restarts_the_container(k8s_cluster: Cluster, namespace: str) -> None:
    pod = http_server_pod("unlive")
    pod["spec"]["containers"][0]["livenessProbe"] = {
        "httpGet": {"path": "/missing", "port": 8080}, "initialDelaySeconds": 1, "periodSeconds": 1,
        "failureThreshold": 2}
    with k8s_cluster.api() as api:
        api.create(path_for("v1", "pods", namespace), pod)
        pod = wait_for_pod(api, namespace, "unlive",
                           lambda p: (p["status"].get("containerStatuses") or [{}])[0].get("restartCount", 0) >= 1,
                           30, "restarted")
    terminated = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert "Liveness probe failed" in terminated["message"]
    assert terminated["exitCode"] == 143  # SIGTERM, reported as 128 + 15


TERM_SCRIPT = """
import os, signal, sys, time
log = os.environ["LOG"]
def note(what):
    with open(log, "a") as f:
        f.write(f"{time.time():.3f} {what}\\n")
def on_term(*_):
    note("SIGTERM")
    if os.environ.get("IGNORE_TERM") != "1":
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
note("started")
while True:
    time.sleep(0.05)
"""


def lines(path: Path) -> list[tuple[float, str]]:
    if not path.exists():
        return []
    return [(float(t), what) for t, what in (line.split(" ", 1) for line in path.read_text().splitlines())]


@pytest.mark.parametrize("ignore_term", [False, True], ids=["exits-on-sigterm", "ignores-sigterm"])
def test_a_deleted_pod_gets_its_prestop_then_sigterm_then_sigkill_at_the_grace_period(
        k8s_cluster: Cluster, namespace: str, tmp_path: Path, ignore_term: bool) -> None:
    log = tmp_path / "events.log"
    pod = local_pod("term", [sys.executable, "-c", TERM_SCRIPT],
                    env=[{"name": "LOG", "value": str(log)}, {"name": "IGNORE_TERM", "value": "1" if ignore_term else "0"}],
                    lifecycle={"preStop": {"sleep": {"seconds": 2}}})
    pod["spec"]["terminationGracePeriodSeconds"] = 4
    with k8s_cluster.api() as api:
        api.create(path_for("v1", "pods", namespace), pod)
        running = wait_for_pod(api, namespace, "term", lambda p: "running" in (
            (p["status"].get("containerStatuses") or [{}])[0].get("state") or {}), 30, "running")
        pid = container_pid(running)
        wait_for(lambda: lines(log), 10, "the process to start")
        deleted = time.time()
        api.delete(path_for("v1", "pods", namespace, "term"))
        wait_gone(api, path_for("v1", "pods", namespace, "term"), 30)
        gone = time.time()
    events = dict((what, t) for t, what in lines(log))
    assert "SIGTERM" in events, lines(log)
    # The kubelet's order: the preStop hook (2 s) first, SIGTERM after it, ...
    assert events["SIGTERM"] - deleted >= 1.9, f"SIGTERM {events['SIGTERM'] - deleted:.1f}s after the deletion"
    if ignore_term:
        # ... and SIGKILL once the grace period (4 s, counted from the deletion) is over.
        assert gone - deleted >= 3.9, f"gone {gone - deleted:.1f}s after the deletion"
    else:
        assert gone - deleted < 3.9, "a process that exits on SIGTERM does not wait out the grace period"
    assert not pid_alive(pid)


def test_volumes_are_directories_and_paths_under_mounts_are_moved(
        k8s_cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    shared = tmp_path / "pv"
    shared.mkdir()
    script = "import os, pathlib; [pathlib.Path(p).write_text(os.environ['POD']) for p in os.environ['OUT'].split(',')]"
    with k8s_cluster.api() as api:
        api.create(path_for("v1", "persistentvolumes"), {
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{namespace}-pv"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                     "hostPath": {"path": str(shared)}}})
        api.create(path_for("v1", "persistentvolumeclaims", namespace), {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": f"{namespace}-pv",
                     "resources": {"requests": {"storage": "1Gi"}}}})
        pod = local_pod("vols", [sys.executable, "-c", script],
                        env=[{"name": "POD", "value": "vols"},
                             {"name": "OUT", "value": "/data/from-pod,/scratch/in-empty-dir"}],
                        volumeMounts=[{"name": "data", "mountPath": "/data"}, {"name": "scratch", "mountPath": "/scratch"}])
        pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                                  {"name": "scratch", "emptyDir": {}}]
        pod["spec"]["restartPolicy"] = "Never"
        try:
            api.create(path_for("v1", "pods", namespace), pod)
            done = wait_for_pod(api, namespace, "vols", lambda p: p["status"].get("phase") in ("Succeeded", "Failed"),
                                60, "finished")
            assert done["status"]["phase"] == "Succeeded", done["status"]
            assert (shared / "from-pod").read_text() == "vols", "the claim is the bound volume's directory"
            assert not Path("/data/from-pod").exists() and not Path("/scratch").exists()
        finally:
            api.delete(path_for("v1", "persistentvolumes", name=f"{namespace}-pv"))
