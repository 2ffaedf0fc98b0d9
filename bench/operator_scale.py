"""The operator at scale, on the local control plane (``python -m bench.operator_scale``).

1. 100 pools (1 pod each, on two fake 64-CPU kwok nodes) are created at once, in one
   ``kubectl apply``; the time until every pool reports Ready for its generation is measured,
   with the count of Ready pools over time.
2. Then nothing changes for two resync periods: the operator visits every pool again and must
   make zero writes. Writes are counted twice, independently: by the operator's own
   ``encoderpool_operator_writes_total`` and API request counters, and by kube-apiserver's
   ``apiserver_request_total`` for the resources the operator writes.
3. How pod events became reconciles (watch events, nudges that ran or were coalesced into a
   pending one, reconciles) and that children and pods came from the watch cache: the
   operator's own client made no LIST of pods and no GET of a child while converging.

Writes bench/results/operator_scale.json and .png. Not a test: numbers, no pass/fail.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.common import RESULTS, write_json

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testkit.cluster import Cluster, ClusterOptions, FakeGpuNode  # noqa: E402
from testkit.cluster.api import path_for, wait_for  # noqa: E402
from testkit.cluster.objects import crd_established  # noqa: E402
from testkit.server import free_port  # noqa: E402

CRD_NAME = "encoderpools.encoderpool.io"

POOLS = int(os.environ.get("ENCODERPOOL_BENCH_POOLS", "100"))
RESYNC_SECONDS = 10.0
NAMESPACE = "scale"
OUR_RESOURCES = ("statefulsets", "services", "poddisruptionbudgets", "horizontalpodautoscalers", "encoderpools")
WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE")


def pool(i: int) -> dict[str, Any]:
    return {"apiVersion": "encoderpool.io/v1alpha1", "kind": "EncoderPool", "metadata": {"name": f"pool-{i:03d}"},
            "spec": {"model": "/opt/encoderpool/models/qwen2_vl-tiny", "device": "cpu", "replicas": 1,
                     "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}}}


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of one metric in a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
            out.append((labels, float(match.group(2))))
    return out


def total(text: str, name: str, **match: Any) -> float:
    """Sum of a metric's samples whose labels match (a value may be a tuple of choices)."""
    def ok(labels: dict[str, str]) -> bool:
        return all(labels.get(k) in (v if isinstance(v, tuple) else (v,)) for k, v in match.items())
    return sum(v for labels, v in samples(text, name) if ok(labels))


class Counters:
    """The operator's and the API server's counters at one moment."""

    def __init__(self, operator: str, apiserver: str) -> None:
        self.operator, self.apiserver = operator, apiserver

    def of(self) -> dict[str, float]:
        """The counters the benchmark reports."""
        op, api = self.operator, self.apiserver
        return {
            "operator_writes": total(op, "encoderpool_operator_writes_total"),
            "operator_write_requests": total(op, "encoderpool_operator_api_requests_total", verb=WRITE_VERBS,
                                             dry_run="false"),
            "operator_dry_runs": total(op, "encoderpool_operator_api_requests_total", dry_run="true"),
            "operator_pod_lists": total(op, "encoderpool_operator_api_requests_total", verb="LIST", resource="pods"),
            "operator_child_gets": total(op, "encoderpool_operator_api_requests_total", verb="GET",
                                         resource=OUR_RESOURCES[:4]),
            "operator_pool_gets": total(op, "encoderpool_operator_api_requests_total", verb="GET", resource="encoderpools"),
            "reconciles": total(op, "encoderpool_operator_reconciles_total"),
            "watch_events": total(op, "encoderpool_operator_watch_events_total"),
            "pod_events": total(op, "encoderpool_operator_watch_events_total", resource="pods"),
            "nudges_ran": total(op, "encoderpool_operator_nudges_total", outcome="ran"),
            "nudges_coalesced": total(op, "encoderpool_operator_nudges_total", outcome="coalesced"),
            "apiserver_writes_to_our_resources": sum(
                total(api, "apiserver_request_total", verb=verb, resource=res)
                for verb in WRITE_VERBS for res in OUR_RESOURCES),
        }


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


def start_operator(cluster: Cluster, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "ENCODERPOOL_OPERATOR_LIVENESS_PORT": str(port),
           "ENCODERPOOL_OPERATOR_RESYNC_SECONDS": str(RESYNC_SECONDS),
           "ENCODERPOOL_OPERATOR_LEADER_ELECTION": "false", "ENCODERPOOL_OPERATOR_WAIT_SECONDS": "1"}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "encoderpool-operator")], env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"the operator did not start: {log.read_text()[-2000:]}")


def ready_count(cluster: Cluster) -> int:
    with cluster.api() as api:
        items = api.get(path_for("encoderpool.io/v1alpha1", "encoderpools", NAMESPACE))["items"]
    return sum(1 for p in items if (p.get("status") or {}).get("reason") == "Ready"
               and p["status"].get("observedGeneration") == p["metadata"]["generation"])


def run() -> dict[str, Any]:
    nodes = (FakeGpuNode("kwok-gpu-0", pods="200"), FakeGpuNode("kwok-gpu-1", pods="200"))
    with Cluster(options=ClusterOptions(fake_gpu_nodes=nodes)) as cluster:
        cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds" / "encoderpools.encoderpool.io.yaml"))
        with cluster.api() as api:
            wait_for(lambda: crd_established(api.get_or_none(path_for(
                "apiextensions.k8s.io/v1", "customresourcedefinitions", name=CRD_NAME))), 60, "the CRD")
        cluster.create_namespace(NAMESPACE)
        proc, port = start_operator(cluster, cluster.log_path("encoderpool-operator"))
        def counters() -> dict[str, float]:
            operator = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            apiserver = httpx.get(cluster.server + "/metrics", headers={"Authorization": f"Bearer {cluster.token}"},
                                  verify=str(cluster.ca_file), timeout=30).text
            return Counters(operator, apiserver).of()

        try:
            manifest = "\n---\n".join(yaml.safe_dump(pool(i)) for i in range(POOLS))
            before = counters()
            began = time.monotonic()
            cluster.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=manifest, timeout=300)
            applied_s = time.monotonic() - began
            timeline = [(0.0, 0)]
            while True:
                ready = ready_count(cluster)
                timeline.append((round(time.monotonic() - began, 2), ready))
                if ready == POOLS or time.monotonic() - began > 600:
                    break
                time.sleep(0.5)
            converge_s = time.monotonic() - began
            converged = counters()
            # Let the last events settle, then watch two resync periods of nothing changing.
            time.sleep(RESYNC_SECONDS)
            quiet_before = counters()
            time.sleep(2 * RESYNC_SECONDS + 1)
            quiet_after = counters()
        finally:
            proc.terminate()
            proc.wait(30)
    create = delta(converged, before)
    noop = delta(quiet_after, quiet_before)
    return {
        "pools": POOLS,
        "pods_per_pool": 1,
        "resync_seconds": RESYNC_SECONDS,
        "converge_seconds": round(converge_s, 2),
        "kubectl_apply_seconds": round(applied_s, 2),
        "ready_timeline": timeline,
        "create": create,
        "noop_resync": noop,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu_count": os.cpu_count(),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times, ready = zip(*result["ready_timeline"])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(times, ready, drawstyle="steps-post")
    ax.set_xlabel(f"seconds since one kubectl apply of all pools started (it returned after "
                  f"{result['kubectl_apply_seconds']:.1f}s)")
    ax.set_ylabel("pools Ready")
    noop = result["noop_resync"]
    ax.set_title(f"{result['pools']} pools: all Ready in {result['converge_seconds']:.1f}s; "
                 f"no-op resync: {noop['operator_writes']:.0f} writes, {noop['reconciles']:.0f} reconciles")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    result = run()
    out = write_json("operator_scale", result)
    plot(result, RESULTS / "operator_scale.png")
    print(json.dumps({k: v for k, v in result.items() if k != "ready_timeline"}, indent=2))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
