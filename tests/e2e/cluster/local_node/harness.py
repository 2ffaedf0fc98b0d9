"""The local node: a Node object whose pods run as real host processes.

``LocalNode`` registers the node, keeps it alive (Lease renewals plus a Ready condition heartbeat,
so the node lifecycle controller never taints it or evicts its pods), watches the pods bound to it
and gives each one a ``PodRunner`` with its own IP (see network.py for which kind).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from ..api import MERGE, ApiClient, ApiError, path_for, wait_for
from ..nodes import LOCAL_NODE_NAME, local_node_manifest, node_ready
from ..procs import Reaper
from .network import PodNetwork, choose_network
from .runner import PodRunner, RunnerSettings
from .status import now_rfc3339

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 10.0
LEASE_SECONDS = 40
WATCH_WINDOW_SECONDS = 30
# Host environment a pod process inherits; everything else comes from the pod spec, as in a container.
PASSTHROUGH_ENV = ("HOME", "LANG", "LC_ALL", "TMPDIR", "USER")


def host_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Base env of pod processes: PATH with this interpreter's bin dir first (so venv entry points
    such as ``encoder-pod`` resolve), a few locale/home variables, plus ``extra``."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])
    env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
    return {**env, "PATH": path, **(extra or {})}


class LocalNode:
    """Registers node ``name`` and runs its pods until ``stop()``."""

    def __init__(self, server: str, token: str, ca_file: Path, workdir: Path, reaper: Reaper,
                 name: str = LOCAL_NODE_NAME, kubelet_version: str = "v0.0.0",
                 extra_env: Mapping[str, str] | None = None, backoff_base: float = 10.0,
                 pod_network: str = "auto") -> None:
        self.name = name
        self._connection = (server, token, ca_file)
        self._manifest = local_node_manifest(name)
        self._kubelet_version = kubelet_version
        self.network: PodNetwork = choose_network(pod_network, reaper)
        self._settings = RunnerSettings(
            api_factory=self._api, reaper=reaper, workdir=workdir, host_ip="127.0.0.1",
            base_env=host_env(extra_env), node_allocatable=self._capacity(), backoff_base=backoff_base,
        )
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._runners: dict[str, PodRunner] = {}
        self._threads: list[threading.Thread] = []

    def _api(self) -> ApiClient:
        server, token, ca_file = self._connection
        return ApiClient(server, token, ca_file)

    def _capacity(self) -> dict[str, str]:
        return {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Register the node, start heartbeat and pod watch, wait until the node is Ready."""
        with self._api() as api:
            node = api.get_or_none(path_for("v1", "nodes", name=self.name))
            if node is None:
                node = api.create(path_for("v1", "nodes"), self._manifest)
            self._heartbeat(api, node["metadata"]["uid"])
            wait_for(lambda: node_ready(api.get(path_for("v1", "nodes", name=self.name))), timeout,
                     f"local node {self.name} Ready")
        for target, label in ((self._heartbeat_loop, "heartbeat"), (self._watch_loop, "watch")):
            thread = threading.Thread(target=target, name=f"{self.name}-{label}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop watching and kill every pod process (joined). Threads blocked on a watch finish
        when the API server goes away; ``join()`` waits for them after that."""
        self._stop.set()
        with self._lock:
            runners = list(self._runners.values())
        for runner in runners:
            runner.stop()
        for runner in runners:
            runner.join(timeout=30)

    def join(self, timeout: float = 10.0) -> None:
        """Wait for the heartbeat and watch threads (call after ``stop()``), release the pod IPs."""
        for thread in self._threads:
            thread.join(timeout=timeout)
        self.network.close()

    @property
    def pod_ips_routable(self) -> bool:
        """True when pod IPs are ordinary addresses that EndpointSlices accept (see network.py)."""
        return self.network.routable

    def runner_count(self) -> int:
        """Pods currently owned by the harness (tests use it to check cleanup)."""
        with self._lock:
            return len(self._runners)

    # --- heartbeat ------------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        with self._api() as api:
            while not self._stop.wait(HEARTBEAT_SECONDS):
                try:
                    uid = api.get(path_for("v1", "nodes", name=self.name))["metadata"]["uid"]
                    self._heartbeat(api, uid)
                except (ApiError, httpx.HTTPError) as err:
                    if not self._stop.is_set():  # errors while the API server stops are expected
                        log.warning("local node: heartbeat failed: %s", err)

    def _heartbeat(self, api: ApiClient, node_uid: str) -> None:
        """Renew the node Lease and report Ready with a fresh heartbeat time."""
        lease_path = path_for("coordination.k8s.io/v1", "leases", "kube-node-lease", self.name)
        renew = now_rfc3339().replace("Z", ".000000Z")  # Lease times are MicroTime
        if api.get_or_none(lease_path) is None:
            api.create(path_for("coordination.k8s.io/v1", "leases", "kube-node-lease"), {
                "metadata": {"name": self.name, "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": node_uid}]},
                "spec": {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": renew},
            })
        else:
            api.patch(lease_path, {"spec": {"renewTime": renew}}, MERGE)
        api.patch(path_for("v1", "nodes", name=self.name) + "/status", self._node_status())

    def _node_status(self) -> dict[str, Any]:
        now = now_rfc3339()
        conditions = [
            {"type": kind, "status": "False", "reason": f"KubeletHas{reason}", "lastHeartbeatTime": now}
            for kind, reason in (("MemoryPressure", "SufficientMemory"), ("DiskPressure", "NoDiskPressure"),
                                 ("PIDPressure", "SufficientPID"))
        ]
        conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                           "message": "encoderpool local-node harness is posting ready status",
                           "lastHeartbeatTime": now})
        capacity = self._capacity()
        return {"status": {
            "capacity": capacity, "allocatable": capacity, "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": self.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {"kubeletVersion": self._kubelet_version, "kubeProxyVersion": "",
                         "operatingSystem": "linux", "architecture": "amd64", "containerRuntimeVersion": "local://0",
                         "osImage": "encoderpool local node", "kernelVersion": os.uname().release,
                         "machineID": "", "systemUUID": "", "bootID": ""},
        }}

    # --- pods -----------------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        """List + watch pods bound to this node; relist after errors or an expired resourceVersion."""
        selector = f"spec.nodeName={self.name}"
        api = self._api()
        while not self._stop.is_set():
            try:
                listing = api.get(path_for("v1", "pods"), fieldSelector=selector)
                self._sync(api, listing.get("items", []))
                version = listing["metadata"]["resourceVersion"]
                while not self._stop.is_set():
                    for event in api.watch(path_for("v1", "pods"), version, WATCH_WINDOW_SECONDS,
                                           fieldSelector=selector):
                        if event["type"] == "ERROR":
                            raise ApiError(event["object"].get("code", 500), event["object"].get("message", ""))
                        version = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            self._on_event(api, event["type"], event["object"])
            except Exception as err:  # noqa: BLE001 - any failure means "relist", and stop ends it
                if self._stop.is_set():
                    break
                log.warning("local node: pod watch restarts after: %s", err)
                self._stop.wait(0.5)
        api.close()

    def _sync(self, api: ApiClient, pods: list[dict[str, Any]]) -> None:
        """After a (re)list: handle every listed pod and forget runners whose pod vanished."""
        listed = {p["metadata"]["uid"] for p in pods}
        with self._lock:
            gone = [r for uid, r in self._runners.items() if uid not in listed]
        for runner in gone:
            runner.stop()
        for pod in pods:
            self._on_event(api, "ADDED", pod)

    def _on_event(self, api: ApiClient, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        with self._lock:
            runner = self._runners.get(uid)
        if kind == "DELETED":
            if runner is not None:
                runner.stop()
            return
        if pod["metadata"].get("deletionTimestamp"):
            if runner is not None:
                grace = pod["metadata"].get("deletionGracePeriodSeconds",
                                            pod["spec"].get("terminationGracePeriodSeconds", 30))
                runner.terminate(float(grace))
            else:  # nothing running (finished pod, or one from before we started): just finish it
                body = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
                try:
                    api.request("DELETE", path_for("v1", "pods", pod["metadata"]["namespace"],
                                                   pod["metadata"]["name"]), body)
                except ApiError as err:
                    log.debug("local node: finalize of finished pod: %s", err)
            return
        if runner is None and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            self._start_runner(pod)

    def _start_runner(self, pod: dict[str, Any]) -> None:
        with self._lock:
            if self._stop.is_set():  # stop() has already collected the runners to kill
                return
            runner = PodRunner(pod, self.network.take(), self._settings, self._runner_exited)
            self._runners[runner.uid] = runner
            runner.start()

    def _runner_exited(self, runner: PodRunner) -> None:
        with self._lock:
            self._runners.pop(runner.uid, None)
        self.network.give_back(runner.pod_ip)
