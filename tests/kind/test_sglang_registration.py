"""spec.sglang.registerURLs reaches a bootstrap server in the cluster with the pods' real IPs.

A test-only stand-in for SGLang's EncoderBootstrapServer (tests/kind/scripts/bootstrap.py) runs as
a pod behind a Service; a CPU pool names that Service. Each encoder pod registers
``http://<its pod IP>:30000`` (ENCODER_ADVERTISE_URL from the downward API's POD_IP) once ready;
scaling up adds a registration, scaling down withdraws the removed pod's (its SIGTERM drain).
"""

from __future__ import annotations

import json

import pytest

from testkit.cluster.api import path_for, wait_for
from testkit.cluster.objects import pod_ready, wait_for_pod
from tests.e2e.pools import Pools, load_example, pool_ready
from tests.kind.incluster import ClientPod, READY_SECONDS as POD_SECONDS, MOUNT, script_pod

pytestmark = pytest.mark.kind

NAME = "registers"
READY_SECONDS = 420.0
PORT = 8998


def test_pods_register_their_pod_ips_and_scaling_reaches_the_bootstrap(pools: Pools, client: ClientPod) -> None:
    bootstrap = script_pod("prefill-bootstrap", ["python", f"{MOUNT}/bootstrap.py", str(PORT)], "Always")
    pools.api.create(path_for("v1", "pods", pools.namespace), bootstrap)
    pools.api.create(path_for("v1", "services", pools.namespace), {
        "metadata": {"name": "prefill-bootstrap"},
        "spec": {"selector": {"app": "prefill-bootstrap"}, "ports": [{"port": PORT, "targetPort": PORT}]}})
    wait_for_pod(pools.api, pools.namespace, "prefill-bootstrap", pod_ready, POD_SECONDS, "Ready")
    service = f"http://prefill-bootstrap.{pools.namespace}.svc:{PORT}"  # a ClusterIP: through kube-proxy

    def registered() -> list[str]:
        out = pools.kubectl("exec", client.name, "--", "python", "-c",
                            f"import httpx; print(httpx.get('{service}/list_encoder_urls', timeout=10).text)")
        return sorted(json.loads(out.stdout)["encoder_urls"])

    def ready_pod_urls() -> list[str]:
        return sorted(f"http://{p['status']['podIP']}:30000" for p in pools.pods(NAME) if pod_ready(p))

    manifest = load_example("encoderpool-cpu.yaml")
    manifest["metadata"]["name"] = NAME
    manifest["spec"].update(replicas=1, parallelism={"tensor": 1, "data": 1}, sglang={"registerURLs": [service]},
                            # two pods beside the client and the bootstrap on one 2-CPU kind node
                            resources={"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "3Gi"}})
    pools.apply(manifest)
    pools.wait(NAME, pool_ready, READY_SECONDS, "Ready")
    first = wait_for(lambda: (urls := registered()) == ready_pod_urls() and urls, 60, "the pod to register its IP")
    pools.kubectl("scale", f"encpool/{NAME}", "--replicas=2")
    pools.wait(NAME, lambda p: pool_ready(p) and p["status"]["readyReplicas"] == 2, READY_SECONDS, "Ready with 2")
    both = wait_for(lambda: len(urls := registered()) == 2 and urls == ready_pod_urls() and urls, 60,
                    "both pods registered")
    pools.kubectl("scale", f"encpool/{NAME}", "--replicas=1")
    pools.wait(NAME, lambda p: pool_ready(p) and p["status"]["replicas"] == 1, READY_SECONDS, "scaled to 1")
    last = wait_for(lambda: (urls := registered()) == first and urls, 120,
                    "the removed pod to withdraw its registration")
    print(f"\nSGLang registration (pod IPs): {first} -> scaled to 2: {both} -> scaled to 1: {last}")
